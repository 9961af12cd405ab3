"""The recurrent-state pool and saved prefix states of a hybrid model's block manager
(``inference.kv.hybrid_blocks``), under the block manager's Hypothesis state machine:

- every slot's reference count equals the running sequences and saved states holding
  it, and a slot is free exactly when nobody holds it (nothing leaks);
- each step's "model" writes a fingerprint of the exact token prefix into the
  sequence's slot, so a restored or forked state that belongs to other tokens shows:
  a sequence always continues from its own prefix's state, and a saved state always
  holds the state of the tokens it is saved under.

The same machine over lower tiers (``inference.kv.hybrid_tiers``: a host tier of two
states over a disk tier) also checks that every state a tier holds is the state of its
own tokens, that tiers stay within their bounds, and that a state promoted from a tier
is one a sequence can continue from (the step's check above).

Plus the points where states are saved and the chunks cut there.
"""

from __future__ import annotations

import shutil
import tempfile
import zlib
from collections import Counter
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from inference.engine.sequence import Sequence
from inference.kv.disk import DiskTier
from inference.kv.hybrid_blocks import HybridBlockManager
from inference.kv.hybrid_tiers import TieredHybridBlockManager
from inference.kv.state_pool import StatePool
from inference.kv.state_spec import RecurrentLayerSpec, RecurrentSpec
from inference.kv.state_tiers import HostStates, StateLayout, StateTiers
from tests.engine.test_block_manager import BS, BlockManagerMachine, new_seq

SPEC = RecurrentSpec((RecurrentLayerSpec(0, (2, 3), (1,)), RecurrentLayerSpec(2, (1,), (2, 2))))


CONVERSATIONS = tuple(tuple((i * 7 + j * j) % 3 for j in range(24)) for i in range(3))


def fingerprint(tokens: list[int] | tuple[int, ...]) -> float:
    """What the stand-in model leaves in a slot after exactly ``tokens`` (never 0)."""
    return float(zlib.crc32(bytes(t % 256 for t in tokens)) % 2**20 + 1)


def state_of(pool: StatePool, slot: int) -> float:
    value = float(pool.states.ssm[1][slot, 0, 0])
    for t in (*pool.states.conv, *pool.states.ssm):
        assert bool((t[slot] == value).all()), "a slot's layers hold states of different prefixes"
    return value


def write_state(pool: StatePool, slot: int, value: float) -> None:
    for t in (*pool.states.conv, *pool.states.ssm):
        t[slot] = value


def manager(num_blocks: int = 32, running: int = 4, saved: int = 4, per_seq: int = 8) -> HybridBlockManager:
    pool = StatePool(SPEC, running + saved)
    return HybridBlockManager(
        num_blocks, BS, states=pool, saved_states_max=saved, saved_states_per_seq=per_seq
    )


class HybridStatesMachine(BlockManagerMachine):
    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans(), saved=st.integers(0, 4))
    def setup(self, num_blocks: int, caching: bool, saved: int) -> None:
        pool = StatePool(SPEC, 6 + saved)
        self.bm = HybridBlockManager(
            num_blocks, BS, enable_prefix_caching=caching, states=pool, saved_states_max=saved
        )
        self.seqs: list[Sequence] = []

    def _room(self) -> bool:
        """A slot for one more sequence (the engine's seat count guarantees it)."""
        return len(self.seqs) < 5

    def _grow(self, seq: Sequence, n: int) -> bool:
        n = self.bm.chunk_limit(seq, min(n, seq.num_tokens - seq.num_computed_tokens))
        if n <= 0 or not self.bm.allocate_slots(seq, n):
            return False
        self.bm.take_copies()
        start = seq.num_computed_tokens
        pool = self.bm.states
        if start > 0:  # the model continues from the slot's state: it must be this prefix's
            assert state_of(pool, seq.state_slot) == fingerprint(seq.token_ids[:start])
        write_state(pool, seq.state_slot, fingerprint(seq.token_ids[: start + n]))
        seq.num_computed_tokens += n
        self.bm.register_full_blocks(seq)
        return True

    # Prompts that extend one of a few conversations, so prefixes (and states) are shared.
    @precondition(lambda self: self._room())
    @rule(
        base=st.sampled_from(CONVERSATIONS),
        keep=st.integers(0, 24),
        suffix=st.lists(st.integers(0, 2), max_size=8),
        chunk=st.integers(1, 30),
    )
    def allocate(self, base: tuple[int, ...], keep: int, suffix: list[int], chunk: int) -> None:
        tokens = list(base[:keep]) + suffix
        if tokens:
            super().allocate(tokens, chunk)

    @precondition(lambda self: self.seqs and self._room())
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        super().fork(data)

    @invariant()
    def slot_counts_equal_holders(self) -> None:
        pool, saved = self.bm.states, self.bm.saved
        holders = Counter(s.state_slot for s in self.seqs if s.state_slot >= 0)
        holders.update(entry.slot for entry in saved)
        for slot in range(pool.num_slots):
            assert pool.ref_counts[slot] == holders[slot]
        assert pool.num_free == sum(1 for c in pool.ref_counts if c == 0), "leaked or double-freed slot"
        assert len(saved) <= saved.max_saved

    @invariant()
    def saved_states_hold_their_tokens(self) -> None:
        for entry in self.bm.saved:
            assert len(entry.tokens) % BS == 0
            assert state_of(self.bm.states, entry.slot) == fingerprint(entry.tokens)

    def teardown(self) -> None:
        for seq in self.seqs:
            self.bm.free(seq)
        self.bm.saved.clear()
        assert self.bm.states.num_free == self.bm.states.num_slots


TestHybridStatesInvariants = HybridStatesMachine.TestCase
TestHybridStatesInvariants.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


class SyncDisk(DiskTier):
    """A disk tier whose writes are on disk when ``write`` returns, so that every run of
    the machine sees the same index."""

    def write(self, *args: Any, **kwargs: Any) -> bool:
        queued = super().write(*args, **kwargs)
        self.flush()
        return queued


class TieredStatesMachine(HybridStatesMachine):
    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans(), saved=st.integers(1, 3))
    def setup(self, num_blocks: int, caching: bool, saved: int) -> None:
        pool = StatePool(SPEC, 6 + saved)
        self.layout = StateLayout(pool)
        self.dir = tempfile.mkdtemp(prefix="hybrid-states-")
        host = HostStates(2 * self.layout.num_bytes, self.layout.num_bytes)
        self.disk = SyncDisk(
            self.dir, 6 * self.layout.num_bytes + 4096, (self.layout.num_bytes,), torch.uint8, {}
        )
        tiers = StateTiers(pool, host=host, disk=self.disk)
        self.bm = TieredHybridBlockManager(
            num_blocks,
            BS,
            enable_prefix_caching=caching,
            states=pool,
            saved_states_max=saved,
            state_tiers=tiers,
        )
        self.seqs: list[Sequence] = []

    @precondition(lambda self: self._room())
    @rule(
        base=st.sampled_from(CONVERSATIONS),
        keep=st.integers(0, 24),
        suffix=st.lists(st.integers(0, 2), max_size=8),
        chunk=st.integers(1, 30),
    )
    def allocate(self, base: tuple[int, ...], keep: int, suffix: list[int], chunk: int) -> None:
        tokens = list(base[:keep]) + suffix
        if not tokens:
            return
        seq = new_seq(tokens)
        # No KV tiers here: a lower tier's state is promoted when the pool holds its blocks.
        assert self.bm.prefix_to_load(seq) is None
        hits = self.bm.match_prefix(seq)
        if self.bm.num_revived(hits) > self.bm.num_free_blocks:
            return
        self.bm.admit(seq, hits)
        if hits:
            assert state_of(self.bm.states, seq.state_slot) == fingerprint(tokens[: len(hits) * BS])
        self.seqs.append(seq)
        if not self._grow(seq, chunk) and seq.num_computed_tokens < seq.num_tokens:
            self.bm.free(seq)
            self.seqs.remove(seq)

    def _value(self, data: torch.Tensor) -> float:
        tensors = self.layout.unpack(data)
        value = float(tensors[0].reshape(-1)[0])
        assert all(bool((t == value).all()) for t in tensors), "a stored state mixes prefixes"
        return value

    @invariant()
    def lower_tiers_hold_their_tokens_states(self) -> None:
        tiers = self.bm.state_tiers
        assert tiers.host is not None
        assert len(tiers.host) <= tiers.host.max_states
        for entry in tiers.host._entries.values():
            assert self._value(entry.data) == fingerprint(entry.tokens)
        assert self.disk.used_bytes <= self.disk.capacity_bytes
        for key, entry in list(self.disk._index.items()):
            data = self.disk.read(key, 0, entry.tokens, entry.namespace)
            assert data is not None and self._value(data) == fingerprint(entry.tokens)

    def teardown(self) -> None:
        super().teardown()
        self.disk.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestTieredStatesInvariants = TieredStatesMachine.TestCase
TestTieredStatesInvariants.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_prompt_save_points_and_chunk_cuts() -> None:
    bm = manager(per_seq=8)
    seq = new_seq(list(range(75)))  # 18 full blocks of 4, the last token at 74
    # Geometric points (1, 2, 4, 8, 16 blocks), then the boundaries before and at the end.
    assert bm.save_points(seq) == [4, 8, 16, 32, 64, 72]
    assert bm.chunk_limit(seq, 75) == 4
    seq.num_computed_tokens = 20
    assert bm.chunk_limit(seq, 55) == 12  # up to 32
    assert bm.chunk_limit(seq, 5) == 5
    capped = manager(per_seq=3)
    assert capped.save_points(new_seq(list(range(75)))) == [32, 64, 72]


def test_a_hit_stops_at_the_longest_saved_state_and_an_answer_end_is_saved() -> None:
    bm = manager(saved=8, per_seq=2)
    first = new_seq([1] * 9)  # saves at 8 (both end points): the state after 8 tokens
    bm.admit(first, bm.match_prefix(first))
    bm.allocate_slots(first, 9)
    first.num_computed_tokens = 8
    write_state(bm.states, first.state_slot, fingerprint(first.token_ids[:8]))
    bm.register_full_blocks(first)
    first.num_computed_tokens = 9
    bm.register_full_blocks(first)
    for token in (5, 6, 7):  # the answer: decoding reaches 12, a block boundary
        first.token_ids.append(token)
        bm.allocate_slots(first, 1)
        first.num_computed_tokens += 1
        write_state(bm.states, first.state_slot, fingerprint(first.token_ids[: first.num_computed_tokens]))
        bm.register_full_blocks(first)
    first.token_ids.append(9)
    bm.free(first)
    assert sorted(len(e.tokens) for e in bm.saved) == [8, 12]
    # The next turn starts with the whole answer: it resumes after it.
    turn = new_seq(first.token_ids + [3, 3, 3])
    assert len(bm.match_prefix(turn)) == 3
    bm.admit(turn, bm.match_prefix(turn))
    assert turn.num_computed_tokens == 12
    assert state_of(bm.states, turn.state_slot) == fingerprint(turn.token_ids[:12])
    # An edit of the last message diverges inside the answer's blocks: back to the prompt's end.
    edit = new_seq([1] * 9 + [4, 4, 4, 4])
    assert len(bm.match_prefix(edit)) == 2
