"""Block manager: ref counts, prefix cache, LRU revival, eviction order, copy-on-write,
and a Hypothesis state machine over random operation sequences checking that no
block leaks, every count equals the number of tables holding the block, and no
block is both free and in use."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from inference.engine.sequence import Sequence
from inference.kv.block_manager import NO_BLOCK, BlockManager
from inference.kv.spec import KVGroup, KVSpec

BS = 4


def new_seq(tokens: list[int]) -> Sequence:
    return Sequence(list(tokens), num_prompt_tokens=len(tokens))


def run(bm: BlockManager, seq: Sequence, upto: int | None = None) -> None:
    """Pretend the model computed the sequence (up to ``upto`` tokens)."""
    n = (upto if upto is not None else seq.num_tokens) - seq.num_computed_tokens
    assert bm.allocate_slots(seq, n)
    seq.num_computed_tokens += n
    bm.register_full_blocks(seq)


def admit(bm: BlockManager, seq: Sequence) -> int:
    hits = bm.match_prefix(seq)
    bm.admit(seq, hits)
    return len(hits)


def test_full_blocks_are_shared_and_the_last_token_is_always_recomputed() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = new_seq(list(range(12)))  # exactly 3 full blocks
    admit(bm, a)
    run(bm, a)
    b = new_seq(list(range(12)))
    # The third block holds the last token, which must run to produce logits.
    assert admit(bm, b) == 2
    assert b.num_computed_tokens == 8
    assert b.block_table == a.block_table[:2]
    assert [bm.blocks[x].ref_count for x in a.block_table] == [2, 2, 1]


def test_hit_requires_equal_tokens_in_every_earlier_block() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = new_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(bm, a)
    run(bm, a)
    edited = new_seq([1, 2, 3, 9, 5, 6, 7, 8, 9])  # same second block, different first
    assert admit(bm, edited) == 0


def test_freed_blocks_are_revived_from_the_lru_list() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = new_seq(list(range(9)))
    admit(bm, a)
    run(bm, a)
    table = list(a.block_table)
    bm.free(a)
    stats = bm.stats()
    assert (stats.used, stats.cached) == (0, 2)  # the partial third block is not cached
    b = new_seq(list(range(9)) + [100])
    assert admit(bm, b) == 2
    assert b.block_table == table[:2]
    assert bm.stats().cached == 0 and bm.stats().used == 2


def test_eviction_takes_empty_blocks_first_then_least_recently_freed() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    older, newer = new_seq([1] * 8 + [0]), new_seq([2] * 8 + [0])
    for s in (older, newer):
        admit(bm, s)
        run(bm, s)
    bm.free(older)
    bm.free(newer)
    assert bm.stats().cached == 4 and bm.stats().free == 2
    # Two fresh blocks come from the never-cached ones: no prefix lost.
    filler = new_seq([3] * 8)
    admit(bm, filler)
    assert bm.allocate_slots(filler, 8)
    assert bm.stats().cached == 4
    # The next one must evict, and the older conversation goes first, tail block first.
    older_tail = older.block_hashes[1]
    more = new_seq([4] * 4)
    admit(bm, more)
    assert bm.allocate_slots(more, 4)
    assert older_tail not in bm._by_hash
    assert older.block_hashes[0] in bm._by_hash
    assert all(h in bm._by_hash for h in newer.block_hashes[:2])


def test_fork_shares_blocks_and_copy_on_write_copies_the_partial_tail() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    parent = new_seq(list(range(6)))
    admit(bm, parent)
    run(bm, parent)
    child = new_seq(parent.token_ids)
    bm.fork(parent, child)
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    parent.token_ids.append(50)
    child.token_ids.append(60)
    # The child's next write (position 6) lands in the shared, half-full second block.
    assert bm.blocks_needed(child, 1) == 1
    assert bm.allocate_slots(child, 1)
    tail = parent.block_table[1]
    assert child.block_table[0] == parent.block_table[0]
    assert child.block_table[1] != tail
    assert bm.take_copies() == [(tail, child.block_table[1])]
    # The parent is now the tail's only holder and writes in place, no copy.
    assert bm.allocate_slots(parent, 1)
    assert parent.block_table[1] == tail and bm.take_copies() == []
    assert bm.blocks[tail].ref_count == 1 and bm.blocks[parent.block_table[0]].ref_count == 2


def test_allocation_fails_without_side_effects_when_the_pool_is_short() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    seq = new_seq(list(range(12)))
    admit(bm, seq)
    assert not bm.allocate_slots(seq, 12)
    assert seq.block_table == [] and bm.num_free_blocks == 2


def test_prefix_caching_off_never_hits() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = new_seq(list(range(9)))
    admit(bm, a)
    run(bm, a)
    bm.free(a)
    assert admit(bm, new_seq(list(range(9)))) == 0
    assert bm.stats().cached == 0


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free / evict; the invariants hold after each."""

    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans())
    def setup(self, num_blocks: int, caching: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
        self.seqs: list[Sequence] = []

    def _grow(self, seq: Sequence, n: int) -> bool:
        """Compute ``n`` more tokens of ``seq`` if the pool allows (like a scheduled step)."""
        n = min(n, seq.num_tokens - seq.num_computed_tokens)
        if n <= 0 or not self.bm.allocate_slots(seq, n):
            return False
        self.bm.take_copies()
        start = seq.num_computed_tokens
        for block_id in {seq.block_table[p // BS] for p in range(start, start + n)}:
            block = self.bm.blocks[block_id]  # writes only go to private, unpublished blocks
            assert block.ref_count == 1 and block.hash is None, "write into a shared block"
        seq.num_computed_tokens += n
        self.bm.register_full_blocks(seq)
        return True

    # A tiny alphabet so that prefixes repeat and the cache gets hits.
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14), chunk=st.integers(1, 14))
    def allocate(self, tokens: list[int], chunk: int) -> None:
        seq = new_seq(tokens)
        hits = self.bm.match_prefix(seq)
        for i, block_id in enumerate(hits):  # a hit is always the same tokens
            assert self.bm.blocks[block_id].token_ids == tuple(tokens[i * BS : (i + 1) * BS])
        if self.bm.num_revived(hits) > self.bm.num_free_blocks:
            return
        self.bm.admit(seq, hits)
        self.seqs.append(seq)
        if not self._grow(seq, chunk) and seq.num_computed_tokens < seq.num_tokens:
            self.bm.free(seq)  # the scheduler undoes a failed admission
            self.seqs.remove(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token=st.integers(0, 2), steps=st.integers(1, 6))
    def append(self, data: st.DataObject, token: int, steps: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self._grow(seq, steps)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(token)  # a sampled token, computed next step
            self._grow(seq, 1)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.seqs))
        child = new_seq(parent.token_ids)
        self.bm.fork(parent, child)
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)

    @rule(n=st.integers(1, 8))
    def evict(self, n: int) -> None:
        """Pressure: a throwaway sequence takes free blocks (evicting cached ones), then leaves."""
        seq = new_seq([7] * (n * BS))
        n = min(n, self.bm.num_free_blocks)
        if n and self.bm.allocate_slots(seq, n * BS):
            self.bm.free(seq)

    @rule()
    def reset_cache(self) -> None:
        self.bm.reset_prefix_cache()

    @invariant()
    def refcounts_equal_holders_and_nothing_leaks(self) -> None:
        bm = self.bm
        holders = Counter(b for s in self.seqs for b in s.block_table)
        free = set(bm._empty) | set(bm._cached_free)
        assert len(bm._empty) + len(bm._cached_free) == len(free), "a block is free twice"
        for block in bm.blocks:
            assert block.ref_count == holders[block.block_id]
            assert (block.ref_count == 0) == (block.block_id in free), "free and in use, or leaked"
        for h, block_id in bm._by_hash.items():
            assert bm.blocks[block_id].hash == h
        for block_id in bm._cached_free:
            assert bm.blocks[block_id].hash is not None
        for block_id in bm._empty:
            assert bm.blocks[block_id].hash is None
        s = bm.stats()
        assert s.used + s.cached + s.free == s.total

    @invariant()
    def tables_cover_the_computed_tokens(self) -> None:
        for seq in self.seqs:
            assert len(seq.block_table) == self.bm.blocks_for(seq.num_computed_tokens)


TestBlockManagerInvariants = BlockManagerMachine.TestCase
TestBlockManagerInvariants.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)


# ---- KV groups with sliding windows -----------------------------------------------------
# (window of each group: None = full attention); block size 4, so a window of 5 reaches
# back into the second block behind the next token, one of 8 into the third.
GROUPINGS = [
    (KVGroup(6, (0,)),),  # Mistral: every layer slides
    (KVGroup(None, (0,)), KVGroup(5, (1,)), KVGroup(5, (2,))),  # Gemma 3 style: full + sliding
    (KVGroup(None, (0,)), KVGroup(8, (1,))),  # gpt-oss style: alternating
]


def test_sliding_blocks_leave_the_pool_as_the_window_moves_on() -> None:
    bm = BlockManager(64, BS, groups=(KVGroup(None, (0,)), KVGroup(5, (1,))))
    seq = new_seq(list(range(40)))
    admit(bm, seq)
    run(bm, seq)  # 40 computed: the next query (position 40) reads keys 36.. (block 9)
    full, sliding = bm.tables(seq)
    assert len(full) == len(sliding) == 10 and NO_BLOCK not in full
    assert sliding[:9] == [NO_BLOCK] * 9 and sliding[9] != NO_BLOCK
    assert bm.num_held_blocks(seq) == 11
    assert bm.stats().cached == 9  # the dropped blocks stay revivable for prefix hits
    seq.token_ids.append(1)
    run(bm, seq)  # one more token: still within block 9/10
    assert bm.tables(seq)[1][:9] == [NO_BLOCK] * 9


def _forget(bm: BlockManager, block_hash: int, group: int) -> None:
    """Evict one cached-free block of ``group`` as pool pressure would."""
    block_id = bm.cached_block(block_hash, group)
    assert block_id is not None and bm.blocks[block_id].ref_count == 0
    del bm._cached_free[block_id]
    bm._evict(bm.blocks[block_id])
    bm._empty.append(block_id)


def test_a_prefix_hit_needs_the_full_groups_whole_and_the_sliding_ones_last_window() -> None:
    bm = BlockManager(64, BS, groups=(KVGroup(None, (0,)), KVGroup(5, (1,))))
    first = new_seq(list(range(40)))
    admit(bm, first)
    run(bm, first)
    bm.free(first)
    # A hit of 8 blocks (32 tokens) then computes position 32, which reads keys from 28
    # on: the sliding group needs its block 7 only, so losing blocks 0..6 costs nothing.
    for i in range(7):
        _forget(bm, first.block_hashes[i], 1)
    other = new_seq(list(range(32)) + [99] * 5)
    hits = bm.match_prefix(other)
    assert len(hits) == 8 and NO_BLOCK not in hits
    assert bm.num_revived(hits, other) == 8 + 1
    bm.admit(other, hits)
    assert bm.tables(other)[1] == [NO_BLOCK] * 7 + [bm.cached_block(first.block_hashes[7], 1)]
    assert other.num_computed_tokens == 32
    bm.free(other)
    # Without block 7 the window is broken there: the longest prefix it still serves is
    # 4 blocks (position 16 reads keys 12.., block 3, which is gone too): nothing.
    _forget(bm, first.block_hashes[7], 1)
    assert bm.match_prefix(new_seq(list(range(32)) + [99] * 5)) == []


class SlidingBlockManagerMachine(BlockManagerMachine):
    """The same operations on a pool shared by several KV groups, some sliding."""

    @initialize(num_blocks=st.integers(6, 40), caching=st.booleans(), grouping=st.sampled_from(GROUPINGS))
    def setup(self, num_blocks: int, caching: bool, grouping: tuple[KVGroup, ...]) -> None:  # type: ignore[override]
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching, groups=grouping)
        self.seqs = []

    def _grow(self, seq: Sequence, n: int) -> bool:
        n = min(n, seq.num_tokens - seq.num_computed_tokens)
        if n <= 0 or not self.bm.allocate_slots(seq, n):
            return False
        self.bm.take_copies()
        start = seq.num_computed_tokens
        for table in self.bm.tables(seq):
            for block_id in {table[p // BS] for p in range(start, start + n)}:
                block = self.bm.blocks[block_id]
                assert block.ref_count == 1 and block.hash is None, "write into a shared block"
        seq.num_computed_tokens += n
        self.bm.register_full_blocks(seq)
        return True

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=20), chunk=st.integers(1, 20))
    def allocate(self, tokens: list[int], chunk: int) -> None:
        seq = new_seq(tokens)
        hits = self.bm.match_prefix(seq)
        if self.bm.num_revived(hits, seq) > self.bm.num_free_blocks:
            return
        self.bm.admit(seq, hits)
        for table in self.bm.tables(seq):  # every group's hit holds the same tokens
            for i, block_id in enumerate(table):
                if block_id != NO_BLOCK:
                    assert self.bm.blocks[block_id].token_ids == tuple(tokens[i * BS : (i + 1) * BS])
        self.seqs.append(seq)
        if not self._grow(seq, chunk) and seq.num_computed_tokens < seq.num_tokens:
            self.bm.free(seq)
            self.seqs.remove(seq)

    @invariant()
    def refcounts_equal_holders_and_nothing_leaks(self) -> None:
        bm = self.bm
        holders = Counter(b for s in self.seqs for t in bm.tables(s) for b in t if b != NO_BLOCK)
        free = set(bm._empty) | set(bm._cached_free)
        assert len(bm._empty) + len(bm._cached_free) == len(free), "a block is free twice"
        for block in bm.blocks:
            assert block.ref_count == holders[block.block_id]
            assert (block.ref_count == 0) == (block.block_id in free), "free and in use, or leaked"
        for g, by_hash in enumerate(bm._hash_maps):
            for h, block_id in by_hash.items():
                assert bm.blocks[block_id].hash == h and bm.blocks[block_id].group == g
        s = bm.stats()
        assert s.used + s.cached + s.free == s.total

    @invariant()
    def tables_cover_the_computed_tokens(self) -> None:
        """Every group's table spans the computed tokens; a sliding one holds exactly the
        blocks its window still reaches (the next query's), and none before them."""
        bm = self.bm
        for seq in self.seqs:
            for g, table in enumerate(bm.tables(seq)):
                assert len(table) == bm.blocks_for(seq.num_computed_tokens)
                first = bm.first_needed_block(g, seq.num_computed_tokens)
                assert all(b == NO_BLOCK for b in table[:first]), "a block outside the window is held"
                assert NO_BLOCK not in table[first:], "a block the window reaches was dropped"


TestSlidingBlockManagerInvariants = SlidingBlockManagerMachine.TestCase
TestSlidingBlockManagerInvariants.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)


def test_kv_groups_share_one_page_size_and_map_every_layer_once() -> None:
    # Gemma-3-4B's layout: every sixth layer full, 29 sliding and 5 full of 34.
    windows = tuple(None if i % 6 == 5 else 1024 for i in range(34))
    spec = KVSpec(34, planes=2, token_shape=(4, 256), windows=windows)
    assert spec.layers_per_block == 5
    assert [(g.window, len(g.layers)) for g in spec.groups] == [(None, 5)] + [(1024, 5)] * 5 + [(1024, 4)]
    assert sorted(layer for g in spec.groups for layer in g.layers) == list(range(34))
    for layer, (group, slot) in enumerate(spec.layer_slots):
        assert spec.groups[group].layers[slot] == layer and spec.groups[group].window == windows[layer]
    assert spec.block_shape(16) == (2, 5, 16, 4, 256)
    plain = KVSpec(4, planes=2, token_shape=(2, 8))  # no windows: one group of every layer
    assert plain.groups == (KVGroup(None, (0, 1, 2, 3)),) and not plain.is_hybrid
