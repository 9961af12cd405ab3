"""A hybrid model's block manager over lower tiers: saved states and the full-attention
layers' KV blocks both go down to host memory and disk, and come back on a prefix hit.

The KV blocks travel as every model's do (``BlockManager`` and ``inference.kv.tiers``);
the saved states through ``inference.kv.state_tiers``. A prefix is served from the
tiers only up to a block boundary where some tier holds the state, so a prompt's
admission looks for the longest prefix with both:

- its KV blocks in the pool, then continued below it (``match_lower``);
- a saved state after exactly that prefix, in the pool or a lower tier (tokens, hash
  and namespace checked). A state from a lower tier is read into the pool's saved
  states at once (``promote``), so it is served like any saved state.

When the KV blocks past the pool's hits must be read too, the sequence goes through the
loading path: its state is installed into its slot when the loads start, and when they
finish with fewer blocks than asked (a failed read), the sequence falls back to the
longest prefix with a state still in the pool (or to the start), releasing the rest.
While loads complete no state is saved: the slot holds the state of the whole loaded
prefix, not of the point the served blocks reach.

A preempted sequence is still recomputed, not swapped (``HybridBlockManager.swap_out``):
a swap would need its running state written down at the preemption point.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from inference.engine.sequence import Sequence
from inference.kv.block_manager import NO_BLOCK, BlockManager, block_namespace
from inference.kv.blocks import PrefixBlocks
from inference.kv.hybrid_blocks import HybridBlockManager
from inference.kv.saved_states import SavedState
from inference.kv.state_tiers import StateTiers


class TieredHybridBlockManager(HybridBlockManager):
    def __init__(self, *args: Any, state_tiers: StateTiers, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state_tiers = state_tiers
        self.saved.on_evict = self._state_evicted
        self._completing = False  # complete_loads is registering blocks: save nothing
        self._loaded_states: dict[int, int] = {}  # seq_id -> tokens its installed state ends at

    def _state_evicted(self, entry: SavedState, retained: bool) -> None:
        self.state_tiers.evicted(entry, retained=retained)

    # ---- saves ------------------------------------------------------------------------
    def _save(self, seq: Sequence, num_tokens: int) -> int | None:
        if self._completing:
            return None
        key = super()._save(seq, num_tokens)
        if key is not None and num_tokens <= seq.num_prompt_tokens:
            entry = self.saved.get(key)  # an answer's boundaries wait for its end (free)
            if entry is not None:
                self.state_tiers.saved(entry)
        return key

    def free(self, seq: Sequence) -> None:
        key = self._decode_saves.get(seq.seq_id)
        entry = self.saved.get(key) if key is not None else None
        if entry is not None:
            self.state_tiers.saved(entry)  # the answer's final state
        self._loaded_states.pop(seq.seq_id, None)
        super().free(seq)

    # ---- prefix hits from the tiers ----------------------------------------------------
    def prefix_to_load(self, seq: Sequence) -> PrefixBlocks | None:
        """``seq``'s prefix when its KV blocks continue below the pool up to a saved state
        (promoted into the pool here); None when the plain admission serves all there is
        (a promoted state whose KV blocks are all in the pool included)."""
        if not self.enable_prefix_caching or seq.score_prompt:
            return None
        bs = self.block_size
        pool_hits = BlockManager.match_prefix(self, seq)
        lower = self.match_lower(seq, len(pool_hits)) if self.tiers is not None else []
        num_kv = len(pool_hits) + len(lower) // self.num_groups
        in_pool = self.restore_point(seq, len(pool_hits))
        hashes = self._hashes(seq, num_kv)
        for k in range(num_kv, in_pool, -1):
            key, tokens = hashes[k - 1], tuple(seq.token_ids[: k * bs])
            namespace = block_namespace(seq, k - 1)
            in_saved = self.saved.lookup(key, tokens) is not None
            if not in_saved and self.state_tiers.find(key, tokens, namespace) is None:
                continue
            to_load = lower[: max(0, k - len(pool_hits)) * self.num_groups]
            if to_load and not (
                self.tiers is not None and self.tiers.worth_loading(to_load, (k - in_pool) * bs)
            ):
                return None
            if not in_saved and not self.promote(key, tokens, namespace):
                continue
            if not to_load:
                return None
            return PrefixBlocks(tuple(pool_hits), tuple(to_load), self.num_revived(pool_hits, seq))
        return None

    def promote(self, key: int, tokens: tuple[int, ...], namespace: int) -> bool:
        """Read a lower tier's state into a slot of the pool's saved states."""
        if self.saved.max_saved <= 0:
            return False
        slot = self.states.allocate()
        while slot is None and self.saved.evict_one():
            slot = self.states.allocate()
        if slot is None:
            return False
        if not self.state_tiers.restore(key, tokens, namespace, slot):
            self.states.release(slot)
            return False
        self.saved.add_restored(key, tokens, slot, namespace)
        return True

    def admit(self, seq: Sequence, hits: Any) -> None:
        """As the hybrid manager's, except that pool hits without a state are allowed: the
        loading path's, whose state (further on) ``start_loads`` installs."""
        BlockManager.admit(self, seq, hits)
        self._give_slot(seq)
        k = len(hits)
        if k:
            entry = self.saved.lookup(self._hashes(seq, k)[k - 1], seq.token_ids[: k * self.block_size])
            if entry is not None:
                self.states.copy(entry.slot, seq.state_slot)
                self.saved.num_hits += 1

    def start_loads(self, seq: Sequence, tiers: Collection[str]) -> None:
        super().start_loads(seq, tiers)
        k, bs = len(seq.block_table), self.block_size
        entry = self.saved.lookup(self._hashes(seq, k)[k - 1], seq.token_ids[: k * bs])
        if entry is not None:
            self.states.copy(entry.slot, seq.state_slot)
            self._loaded_states[seq.seq_id] = k * bs

    def complete_loads(self, seq: Sequence, count_hits: bool = True) -> int:
        target = self._loaded_states.pop(seq.seq_id, None)
        self._completing = True
        try:
            served = super().complete_loads(seq, count_hits)
        finally:
            self._completing = False
        if target is not None and seq.num_computed_tokens == target:
            self.saved.num_hits += 1
            return served
        return max(0, served - self._roll_back(seq))

    def _roll_back(self, seq: Sequence) -> int:
        """Cut ``seq`` back to its longest prefix with a state in the pool (or to nothing),
        releasing the blocks after it; returns the tokens given up."""
        bs, before = self.block_size, seq.num_computed_tokens
        k = self.restore_point(seq, before // bs)
        if k:
            entry = self.saved.lookup(self._hashes(seq, k)[k - 1], seq.token_ids[: k * bs])
            assert entry is not None
            self.states.copy(entry.slot, seq.state_slot)
        for table in self.tables(seq):
            for block_id in table[k:]:
                if block_id != NO_BLOCK:
                    self._release(block_id)
            del table[k:]
        seq.num_registered_blocks = min(seq.num_registered_blocks, k)
        seq.num_computed_tokens = k * bs
        return before - k * bs

    # ---- purge ------------------------------------------------------------------------
    def purge_namespace(self, namespace: int) -> int:
        if namespace:
            self.state_tiers.purge_namespace(namespace)
        return super().purge_namespace(namespace)
