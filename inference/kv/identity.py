"""What makes a cached block the one a lookup asks for, in every tier.

A block hash is only an index: before a tier serves a block it checks the hash chain's
parent, the exact tokens and the salt namespace, so a hash collision or another user's
block is never served."""

from __future__ import annotations

from typing import Protocol


class CachedBlock(Protocol):
    parent: int
    tokens: tuple[int, ...]
    namespace: int


def is_block(entry: CachedBlock | None, parent: int, tokens: tuple[int, ...], namespace: int) -> bool:
    return (
        entry is not None
        and entry.parent == parent
        and entry.tokens == tokens
        and entry.namespace == namespace
    )
