"""Directories and files only this user may use: the one check every layer shares.

The site's data directory (database, secret key), the KV disk tier (plaintext token ids
and the K/V computed from them) and the C kernels' build cache (code this process loads)
all trust what they find in a directory. A directory another user owns or may write to
could hold planted or swapped files, so it is refused (``UnsafePathError``); one we
own that others may only read is tightened to 0700 where its contents are private.

It lives in the lowest layer (``chatsite -> conversations -> inference -> kernels``)
because all four need the same check and it needs nothing but the standard library; placed
higher, the kernels' build cache could not use it.
Files are created 0600 with ``os.open``'s mode, so the process umask (often 022) never
decides who can read them, and nothing else the process writes changes mode.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafePathError(PermissionError):
    """A directory another user owns or may write to (or a file another user owns): its contents could be planted or swapped."""


def ensure_private_dir(path: str | os.PathLike[str], *, tighten: bool = True) -> Path:
    """``path`` as a directory this user owns and only this user may write to, created
    0700 (with any missing parents) if absent. ``tighten``: also take away other users'
    read and search access (for private data; a build cache of code leaves it).

    Raises ``UnsafePathError`` for a directory owned by another user or writable
    by group or others, and ``OSError`` when it cannot be created."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise UnsafePathError(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        raise UnsafePathError(f"{path} is writable by other users (mode {oct(info.st_mode & 0o777)})")
    if tighten and info.st_mode & 0o077:
        os.chmod(path, DIR_MODE)
    return path


def open_private_file(
    path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
) -> int:
    """``os.open`` a file that is 0600 whatever the umask: a new file is created so, an
    existing one of ours is tightened (its earlier mode survives ``O_CREAT``). Returns the fd."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise UnsafePathError(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tighten_file(path: str | os.PathLike[str]) -> bool:
    """Make an existing file of ours 0600; False if there is no such file. Raises
    ``UnsafePathError`` for a file another user owns."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    if info.st_uid != os.getuid():
        raise UnsafePathError(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        os.chmod(path, FILE_MODE)
    return True
