"""The site's private files: the data directory and the SQLite database beside it.

``VAR_DIR`` holds the database, the generated secret key and the beat schedule, so it is
owner-only (0700); one that another user owns or may write to is refused at start
(``chatsite_kernels.private_paths``, the same check the C kernels' build cache and the KV disk tier use).

The SQLite file is created 0600 before SQLite first opens it: SQLite gives the ``-wal``,
``-shm`` and ``-journal`` files it creates the database file's own permissions, so they are
private too, whatever the umask. Creating the file ourselves (rather than setting a umask
of 077 for the whole process) leaves the mode of everything else the process writes, such
as collected static files, as it was. A ``connection_created`` receiver tightens, once per
process and file, databases created some other way (Django's test databases) or left
readable by an earlier version, with their ``-wal``/``-shm`` files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chatsite_kernels.private_paths import ensure_private_dir, open_private_file, tighten_file

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")
_tightened: set[str] = set()


def prepare_data_dir(path: Path) -> None:
    """``path`` created or tightened to 0700; ``UnsafePathError`` if others could write to it."""
    ensure_private_dir(path)


def is_sqlite_file(name: object) -> bool:
    """A database name that is a file on disk (not ``:memory:`` or a ``file:`` URI)."""
    text = str(name or "")
    return bool(text) and text != ":memory:" and not text.startswith("file:")


def prepare_sqlite_database(name: object) -> None:
    """Create the SQLite file 0600 if it is missing, and tighten it and its companions
    (before SQLite opens it, so its WAL and shared-memory files are born private)."""
    if not is_sqlite_file(name):
        return
    path = Path(str(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(open_private_file(path, os.O_RDWR | os.O_CREAT))  # an empty file is an empty database
    tighten_sqlite_files(path)


def tighten_sqlite_files(path: Path) -> None:
    for suffix in SQLITE_COMPANIONS:
        tighten_file(f"{path}{suffix}")
    _tightened.add(str(path))


def on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: a SQLite database's files are 0600 once per process."""
    if connection.vendor != "sqlite":
        return
    name = connection.settings_dict.get("NAME")
    if is_sqlite_file(name) and str(name) not in _tightened:
        tighten_sqlite_files(Path(str(name)))
