"""Which prefix-cache blocks are retained, and by which keys.

A key (an open conversation) marks the chained hashes of a prefix's full blocks; a
hash stays retained while any key marks it. The block manager evicts retained blocks
last, and the tiers below the pool evict them last too and never drop them on the way
down, so both ask this one registry. It is built before either, so each is built whole
with it (the tiers need it at construction, and the block manager needs the tiers).
"""

from __future__ import annotations

from collections.abc import KeysView


class Retention:
    def __init__(self) -> None:
        self._by_key: dict[str, list[int]] = {}  # key -> the hashes it marks, in chain order
        self._counts: dict[int, int] = {}  # block hash -> keys marking it

    def is_retained(self, block_hash: int) -> bool:
        return block_hash in self._counts

    def keys(self) -> KeysView[str]:
        """The keys with a mark in force (a live view)."""
        return self._by_key.keys()

    def hashes(self, key: str) -> list[int]:
        """The hashes ``key`` marks (empty when it marks nothing)."""
        return list(self._by_key.get(key, ()))

    @property
    def num_keys(self) -> int:
        return len(self._by_key)

    @property
    def num_hashes(self) -> int:
        """Distinct hashes some key marks."""
        return len(self._counts)

    def mark(self, key: str, hashes: list[int]) -> None:
        """``key`` marks ``hashes``; unmark it first (a key marks one prefix at a time)."""
        assert key not in self._by_key, "unmark the key's earlier prefix first"
        self._by_key[key] = hashes
        for h in hashes:
            self._counts[h] = self._counts.get(h, 0) + 1

    def unmark(self, key: str) -> list[int]:
        """``key`` marks nothing any more. Returns the hashes no key marks now, in chain order."""
        released = []
        for h in self._by_key.pop(key, []):
            count = self._counts[h] - 1
            if count:
                self._counts[h] = count
            else:
                del self._counts[h]
                released.append(h)
        return released
