"""The block manager of a hybrid model: KV blocks for the full-attention layers, a
state slot per sequence for the recurrent ones, and prefix reuse of both.

A prefix hit must give every layer the same prefix: the full-attention layers their
cached blocks, the recurrent layers a saved state (``inference.kv.saved_states``) taken
after exactly those tokens. So a hit is cut back to the longest saved block boundary
inside the blocks' hit, the state is copied into the sequence's own slot, and only the
tokens after it run again.

States are saved where the next request is likely to resume:

- **end of an answer**: while a sequence decodes, the state at each block boundary
  replaces its previous one, so when it finishes the state at the last boundary of the
  answer stays saved (a chat's next turn starts with the whole answer; a regenerate or
  an edit of the last message resumes at the previous answer's end);
- **end of a prompt**: the boundaries just before its last token and at its end (a
  repeat of the prompt, or a longer one that extends it);
- **inside long prompts**: at geometrically spaced block boundaries (1, 2, 4, 8, …
  blocks), so a prompt sharing only the start of an earlier one still hits. The
  scheduler cuts prefill chunks at these points (``chunk_limit``) so that the state
  after a chunk is exactly a point's state. ``saved_states_per_seq`` bounds how many a
  sequence saves (the end-of-prompt points first, then the longest inner ones).

Lower KV tiers cannot serve a hybrid prefix without its state, so this manager loads no
blocks from them; ``inference.kv.hybrid_tiers`` does, with the states' own tiers. A
preempted sequence is recomputed, not swapped.

Speculative decoding (``inference.spec.hybrid``): a verify step runs the recurrent
layers over the sequence's last token and its proposal as one span, which leaves the
state after the whole proposal. ``begin_verify`` keeps the state from before the step
in a slot of its own; ``end_verify`` keeps the new state when every proposed token was
accepted, and otherwise puts the old one back and rewinds the sequence to the step's
start, so the next step recomputes the accepted tokens (a chunk of ``accepted + 2``).
"""

from __future__ import annotations

from typing import Any

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager, block_namespace
from inference.kv.blocks import PrefixBlocks
from inference.kv.saved_states import SavedStates
from inference.kv.state_pool import StatePool


class HybridBlockManager(BlockManager):
    supports_speculation = True

    def __init__(
        self,
        *args: Any,
        states: StatePool,
        saved_states_max: int,
        saved_states_per_seq: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.states = states
        self.saved = SavedStates(states, saved_states_max, self.retention.is_retained)
        self.saved_states_per_seq = saved_states_per_seq
        self._decode_saves: dict[int, int] = {}  # seq_id -> the key of its latest end-of-answer save
        self._verifying: dict[int, int] = {}  # seq_id -> the slot keeping its state from before the step

    # ---- where states are saved -------------------------------------------------------
    def save_points(self, seq: Sequence) -> list[int]:
        """Token counts inside ``seq``'s prompt after which its state is saved, ascending."""
        if not self.enable_prefix_caching or seq.cache_private or seq.score_prompt:
            return []
        bs, n = self.block_size, seq.num_prompt_tokens
        ends = [((n - 1) // bs) * bs, (n // bs) * bs]
        points = [p for p in dict.fromkeys(ends) if p > 0]
        inner = []
        blocks, limit = 1, points[0] if points else 0
        while blocks * bs < limit:
            inner.append(blocks * bs)
            blocks *= 2
        room = max(0, self.saved_states_per_seq - len(points))
        chosen = points[: self.saved_states_per_seq] + (inner[-room:] if room else [])
        return sorted(chosen)

    def chunk_limit(self, seq: Sequence, num_new_tokens: int) -> int:
        """Cut a prefill chunk at the first save point inside it."""
        start = seq.num_computed_tokens
        end = start + num_new_tokens
        if num_new_tokens <= 1 or start >= seq.num_prompt_tokens:
            return num_new_tokens
        for point in self.save_points(seq):
            if start < point < end:
                return point - start
        return num_new_tokens

    def register_full_blocks(self, seq: Sequence) -> None:
        if seq.seq_id in self._verifying:
            return  # its blocks and state are settled by ``end_verify``
        super().register_full_blocks(seq)
        computed = seq.num_computed_tokens
        if computed == 0 or computed % self.block_size or seq.state_slot < 0:
            return

        if computed <= seq.num_prompt_tokens:
            if computed in self.save_points(seq):
                self._save(seq, computed)
            return
        if not self.enable_prefix_caching or seq.cache_private:
            return
        # Decoding: this boundary's state replaces the previous one of the same answer.
        previous = self._decode_saves.get(seq.seq_id)
        key = self._save(seq, computed)
        if key is not None:
            self._decode_saves[seq.seq_id] = key
            if previous is not None and previous != key:
                self.saved.drop(previous)

    def _save(self, seq: Sequence, num_tokens: int) -> int | None:
        k = num_tokens // self.block_size
        key = self._hashes(seq, k)[k - 1]  # the memo may run further than k blocks
        namespace = block_namespace(seq, k - 1)
        if self.saved.save(key, tuple(seq.token_ids[:num_tokens]), seq.state_slot, namespace):
            return key
        return None

    # ---- prefix hits ----------------------------------------------------------------
    def restore_point(self, seq: Sequence, num_blocks: int) -> int:
        """The longest prefix of at most ``num_blocks`` blocks with a saved state (in blocks)."""
        bs = self.block_size
        hashes = self._hashes(seq, num_blocks)
        for k in range(num_blocks, 0, -1):
            if self.saved.lookup(hashes[k - 1], seq.token_ids[: k * bs]) is not None:
                return k
        return 0

    def match_prefix(self, seq: Sequence) -> list[int]:
        hits = super().match_prefix(seq)
        return hits[: self.restore_point(seq, len(hits))] if hits else hits

    def prefix_to_load(self, seq: Sequence) -> PrefixBlocks | None:
        return None

    def swap_out(self, seq: Sequence) -> bool:
        return False

    def admit(self, seq: Sequence, hits: Any) -> None:
        super().admit(seq, hits)
        self._give_slot(seq)
        k = len(hits)
        if k:
            key = self._hashes(seq, k)[k - 1]
            entry = self.saved.lookup(key, seq.token_ids[: k * self.block_size])
            assert entry is not None, "admit takes match_prefix's answer for this sequence"
            self.states.copy(entry.slot, seq.state_slot)
            self.saved.num_hits += 1

    def _give_slot(self, seq: Sequence) -> None:
        if seq.state_slot < 0:
            seq.state_slot = self.saved.free_slot_for_running()

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child continues from the parent's state: a copy in a slot of its own."""
        super().fork(parent, child)
        self._give_slot(child)
        self.states.copy(parent.state_slot, child.state_slot)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        self._give_slot(seq)
        return super().allocate_slots(seq, num_new_tokens)

    # ---- speculative verification ---------------------------------------------------
    def begin_verify(self, seq: Sequence) -> bool:
        """Keep ``seq``'s state before a verify step runs; False when no slot is free
        (the sequence then decodes plainly)."""
        slot = self.states.allocate()
        while slot is None and self.saved.evict_one():
            slot = self.states.allocate()
        if slot is None:
            return False
        self.states.copy(seq.state_slot, slot)
        self._verifying[seq.seq_id] = slot
        return True

    def cancel_verify(self, seq: Sequence) -> None:
        self.states.release(self._verifying.pop(seq.seq_id))

    def end_verify(self, seq: Sequence, start: int, accepted: int, proposed: int) -> bool:
        """Settle a verify step that began at ``start`` computed tokens (its first row,
        the last sampled token, at position ``start``). All ``proposed`` tokens accepted:
        the state after the span is the sequence's, its positions are computed. Fewer:
        the state from before the step comes back and the sequence rewinds to ``start``,
        keeping the blocks of the positions to recompute. True when it rewound."""
        snapshot = self._verifying.pop(seq.seq_id)
        try:
            if accepted == proposed:
                seq.num_computed_tokens = start + 1 + accepted
                self.register_full_blocks(seq)
                self.truncate(seq, seq.num_computed_tokens)
                return False
            if seq.state_slot >= 0:
                self.states.copy(snapshot, seq.state_slot)
            seq.num_computed_tokens = start
            self.truncate(seq, start + 1 + accepted)
            return True
        finally:
            self.states.release(snapshot)

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        self._decode_saves.pop(seq.seq_id, None)
        if (snapshot := self._verifying.pop(seq.seq_id, None)) is not None:
            self.states.release(snapshot)

        if seq.state_slot >= 0:
            self.states.release(seq.state_slot)
            seq.state_slot = -1

    def purge_namespace(self, namespace: int) -> int:
        if namespace:
            self.saved.purge_namespace(namespace)
        return super().purge_namespace(namespace)

    def reset_prefix_cache(self) -> int:
        self.saved.clear()
        return super().reset_prefix_cache()
