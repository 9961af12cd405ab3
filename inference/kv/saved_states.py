"""Saved recurrent states of a hybrid model, keyed by the prefix they end.

A recurrent layer's state after token ``n`` cannot be rebuilt from cached KV blocks,
only from a copy taken when a sequence passed ``n``. A saved state sits in a slot of
the state pool (``inference.kv.state_pool``) under the prefix cache's chained hash of
the block that ends at ``n`` (``n`` is always a block boundary, so the full-attention
layers' blocks of the same prefix can serve it too), with the exact prefix tokens: a
hash is served only when its tokens match.

Entries are evicted least recently used first, those under a retained hash (an open
conversation's history, ``inference.kv.retention``) only when no other is left. A
running sequence that needs a slot evicts a saved state; the pool always keeps one
slot per running sequence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from inference.kv.state_pool import StatePool


@dataclass(eq=False, slots=True)
class SavedState:
    key: int  # the chained hash of the prefix's last block
    tokens: tuple[int, ...]  # the exact prefix, compared on a hit
    slot: int
    namespace: int = 0  # the salt namespace of the prefix's last block (purged with it)


class SavedStates:
    def __init__(
        self,
        pool: StatePool,
        max_saved: int,
        is_retained: Callable[[int], bool] = lambda _: False,
        on_evict: Callable[[SavedState, bool], None] | None = None,
    ) -> None:
        self.pool = pool
        # Called with (entry, retained) before an evicted entry's slot is released: the
        # lower tiers take a copy (``inference.kv.state_tiers``).
        self.on_evict = on_evict
        self.max_saved = max_saved
        self.is_retained = is_retained
        self._entries: OrderedDict[int, SavedState] = OrderedDict()  # least recently used first
        self.num_saves = 0
        self.num_hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[SavedState]:
        return iter(list(self._entries.values()))

    def lookup(self, key: int, tokens: tuple[int, ...] | list[int]) -> SavedState | None:
        """The state saved after exactly ``tokens`` (``key`` their chained hash), or None;
        a hash whose tokens differ is a miss."""
        entry = self._entries.get(key)
        if entry is None or len(entry.tokens) != len(tokens) or entry.tokens != tuple(tokens):
            return None
        self._entries.move_to_end(key)
        return entry

    def get(self, key: int) -> SavedState | None:
        """The entry under ``key`` whatever its tokens (its owner's bookkeeping, not a hit)."""
        return self._entries.get(key)

    def contains(self, key: int) -> bool:
        return key in self._entries

    def save(self, key: int, tokens: tuple[int, ...], src_slot: int, namespace: int = 0) -> bool:
        """Copy the state in ``src_slot`` (the state after exactly ``tokens``) into a slot of
        its own under ``key``. False when no slot can be had."""
        if self.max_saved <= 0:
            return False
        entry = self._entries.get(key)
        if entry is not None and entry.tokens == tokens:
            self._entries.move_to_end(key)
            return True
        if entry is not None:  # a 64-bit collision: the newer prefix takes the key
            self.drop(key)
        while len(self._entries) >= self.max_saved:
            self.evict_one()
        slot = self.pool.allocate()
        if slot is None:
            if not self.evict_one():
                return False
            slot = self.pool.allocate()
            assert slot is not None
        self.pool.copy(src_slot, slot)
        self._entries[key] = SavedState(key, tokens, slot, namespace)
        self.num_saves += 1
        return True

    def add_restored(self, key: int, tokens: tuple[int, ...], slot: int, namespace: int = 0) -> None:
        """Take over ``slot`` (count 1, already holding the state: a lower tier's copy)."""
        if key in self._entries:
            self.pool.release(slot)
            return
        while len(self._entries) >= self.max_saved and self.evict_one():
            pass
        self._entries[key] = SavedState(key, tokens, slot, namespace)

    def drop(self, key: int) -> SavedState | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.pool.release(entry.slot)
        return entry

    def evict_one(self) -> bool:
        """Drop the least recently used saved state (retained ones last). False if none."""
        victim = next((k for k in self._entries if not self.is_retained(k)), None)
        if victim is None:
            victim = next(iter(self._entries), None)
        if victim is None:
            return False
        if self.on_evict is not None:
            self.on_evict(self._entries[victim], self.is_retained(victim))
        self.drop(victim)
        return True

    def free_slot_for_running(self) -> int:
        """A slot for a running sequence, evicting saved states as needed."""
        slot = self.pool.allocate()
        while slot is None:
            if not self.evict_one():
                raise RuntimeError("state pool exhausted: more running sequences than slots")
            slot = self.pool.allocate()
        return slot

    def purge_namespace(self, namespace: int) -> int:
        victims = [k for k, e in self._entries.items() if e.namespace == namespace]
        for key in victims:
            self.drop(key)
        return len(victims)

    def clear(self) -> int:
        n = len(self._entries)
        for key in list(self._entries):
            self.drop(key)
        return n
