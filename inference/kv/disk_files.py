"""Where the disk tier's block files live: unsalted blocks at the top of its directory,
a salted block in a directory named for its salt namespace, so that a namespace's files
can be found (and deleted) from the file system alone, also after a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

SUFFIX = ".kv"


def block_path(root: Path, block_hash: int, namespace: int = 0) -> Path:
    folder = root / f"{namespace:016x}" if namespace else root
    return folder / f"{block_hash:016x}{SUFFIX}"


def namespace_dir(root: Path, namespace: int) -> Path:
    return block_path(root, 0, namespace).parent


def namespace_of_dir(path: Path) -> int | None:
    """The namespace a block directory is named for (16 hex digits), else None."""
    name = path.name
    if len(name) != 16 or not path.is_dir():
        return None
    try:
        return int(name, 16)
    except ValueError:
        return None


def block_files(root: Path) -> Iterator[tuple[int, Path]]:
    """(namespace, path) of every block file under ``root``."""
    for path in root.glob(f"*{SUFFIX}"):
        yield 0, path
    for folder in root.iterdir():
        namespace = namespace_of_dir(folder)
        if namespace is not None:
            for path in folder.glob(f"*{SUFFIX}"):
                yield namespace, path


def remove_namespace_files(folder: Path) -> int:
    """Delete a namespace directory's block files (and temporary ones), then the directory
    unless a write is just putting a file there; returns the blocks deleted."""
    removed = 0
    for path in folder.glob("*"):
        if path.suffix in (SUFFIX, ".tmp"):
            path.unlink(missing_ok=True)
            removed += path.suffix == SUFFIX
    try:
        folder.rmdir()
    except OSError:
        pass
    return removed
