"""The KV tiers without a model: the disk tier's files, LRU and failure modes, the host
tier's bookkeeping on CPU tensors, retention in the block manager, the cost model, the
preemption victim, namespace purges, and a Hypothesis state machine over interleaved
admit / compute / evict / write / read / retain / release / abort / corrupt / purge (of
a salt namespace) keeping the invariants across the pool and both tiers."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Request, RequestStatus, Sequence
from inference.kv.block_manager import NO_BLOCK, BlockManager, tier_hash
from inference.kv.chain_hash import prefix_hashes
from inference.kv.disk import _HEADER, FINGERPRINT_FILE, DiskTier
from inference.kv.disk_files import namespace_dir
from inference.kv.host import HostTier
from inference.kv.retention import Retention
from inference.kv.salt import cache_salt
from inference.kv.spec import KVGroup
from inference.kv.tiers import TierStack
from inference.sampling.params import SamplingParams

BS = 4
SHAPE = (2, 3, 5)  # any trailing shape: the tiers never look inside a block


def block_value(block_hash: int, group: int = 0) -> torch.Tensor:
    """What "the model" computes for a block: a function of its chained hash and its KV
    group (each group's page holds other layers), exact in fp64."""
    return torch.full(SHAPE, float(tier_hash(block_hash, group) % 2**50), dtype=torch.float64)


def make_disk(path: Path, blocks: int = 64, **kw) -> DiskTier:
    nbytes = int(torch.tensor(SHAPE).prod()) * 8
    capacity = blocks * (_HEADER.size + 8 * BS + nbytes)  # header + BS token ids + payload
    return DiskTier(path, capacity, SHAPE, torch.float64, {"weights": "w", "block_size": BS}, **kw)


def compute(bm: BlockManager, pool: torch.Tensor, seq: Sequence) -> None:
    """Pretend the model ran ``seq`` to its end: write each full block's value, register."""
    n = seq.num_tokens - seq.num_computed_tokens
    assert bm.allocate_slots(seq, n)
    seq.num_computed_tokens += n
    hashes = prefix_hashes(seq.token_ids, BS, seq.cache_salt, seq.cache_salt_block)
    for g, table in enumerate(bm.tables(seq)):
        for i, h in enumerate(hashes):
            if table[i] != NO_BLOCK:
                pool[table[i]] = block_value(h, g)
    bm.register_full_blocks(seq)


# ---- disk tier ---------------------------------------------------------------------------------


def test_disk_tier_round_trips_a_block_and_checks_tokens(tmp_path: Path) -> None:
    disk = make_disk(tmp_path)
    data = torch.randn(SHAPE, dtype=torch.float64)
    assert disk.write(7, 3, (1, 2, 3, 4), data)
    disk.flush()
    assert disk.lookup(7, 3, (1, 2, 3, 4))
    assert not disk.lookup(7, 3, (1, 2, 3, 5))  # a hash collision is a miss
    assert not disk.lookup(7, 4, (1, 2, 3, 4))
    assert torch.equal(disk.read_async(7, 3, (1, 2, 3, 4)).result(), data)
    disk.close()


def test_disk_tier_is_bounded_and_evicts_unretained_before_retained(tmp_path: Path) -> None:
    retained = {1}
    disk = make_disk(tmp_path, blocks=3, is_retained=lambda h: h in retained)
    for h in range(1, 6):
        disk.write(h, 0, (h,) * BS, block_value(h))
        disk.flush()
    assert disk.used_bytes <= disk.capacity_bytes
    assert disk.contains(1) and disk.contains(4) and disk.contains(5)  # 1 is retained, though oldest
    assert sorted(p.name for p in tmp_path.glob("*.kv")) == sorted(f"{h:016x}.kv" for h in (1, 4, 5))
    disk.close()


def test_a_full_queue_drops_writes_but_forced_writes_always_land(tmp_path: Path) -> None:
    disk = make_disk(tmp_path, queue_blocks=1)
    # Stall the writer so the queue fills: hold the lock its next write needs.
    with disk._lock:
        results = [disk.write(h, 0, (h,), block_value(h)) for h in range(10, 20)]
        assert disk.write(99, 0, (99,), block_value(99), force=True)
    assert results.count(False) >= 7 and disk.writes_dropped == results.count(False)
    disk.flush()
    assert disk.lookup(99, 0, (99,))
    disk.close()


def test_warm_restart_finds_blocks_and_a_new_fingerprint_empties_the_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = make_disk(tmp_path)
    disk.write(5, 0, (1, 2, 3, 4), block_value(5))
    disk.close()
    again = make_disk(tmp_path)
    assert again.lookup(5, 0, (1, 2, 3, 4))
    assert torch.equal(again.read(5, 0, (1, 2, 3, 4)), block_value(5))
    again.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        other = DiskTier(tmp_path, 10**6, SHAPE, torch.float64, {"weights": "w", "block_size": 8})
    assert len(other) == 0 and not list(tmp_path.glob("*.kv"))
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "fingerprint changed" in warnings[0]
    assert '"block_size": 8' in (tmp_path / FINGERPRINT_FILE).read_text()
    other.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_or_truncated_block_file_is_never_served(tmp_path: Path, damage: str) -> None:
    disk = make_disk(tmp_path)
    disk.write(5, 0, (1, 2, 3, 4), block_value(5))
    disk.close()
    path = tmp_path / f"{5:016x}.kv"
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0x40
    else:
        raw = raw[:-9]
    path.write_bytes(bytes(raw))
    again = make_disk(tmp_path)
    assert again.read_async(5, 0, (1, 2, 3, 4)).result() is None
    assert again.corrupt_blocks == 1 and not path.exists() and not again.lookup(5, 0, (1, 2, 3, 4))
    again.close()


def test_size_zero_or_an_unwritable_directory_turns_the_tier_off_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        zero = DiskTier(tmp_path / "kv", 0, SHAPE, torch.float64, {})
        unwritable = DiskTier(blocker / "kv", 10**6, SHAPE, torch.float64, {})
    assert not zero.enabled and not unwritable.enabled
    assert len(caplog.records) == 2 and all("off" in r.message for r in caplog.records)
    assert not zero.write(1, 0, (1,), block_value(1)) and not zero.lookup(1, 0, (1,))


def test_a_full_disk_during_writes_turns_the_tier_off_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = make_disk(tmp_path)

    def no_space(job) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk, "_write_file", no_space)
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        disk.write(1, 0, (1,), block_value(1))
        disk.flush()
        disk.write(2, 0, (2,), block_value(2))
        disk.flush()
    assert not disk.enabled
    assert len(caplog.records) == 1 and "disk is full" in caplog.records[0].message
    disk.close()


def test_disk_tier_serves_a_block_only_to_its_namespace_and_a_purge_deletes_its_files(tmp_path: Path) -> None:
    a, b = cache_salt("user:1", None).namespace, cache_salt("user:2", None).namespace
    disk = make_disk(tmp_path)
    disk.write(7, 3, (1, 2, 3, 4), block_value(7), namespace=a)
    disk.write(8, 3, (1, 2, 3, 4), block_value(8), namespace=b)
    disk.write(9, 0, (5, 6, 7, 8), block_value(9))  # unsalted: shared by everyone
    disk.flush()
    assert disk.lookup(7, 3, (1, 2, 3, 4), a) and not disk.lookup(7, 3, (1, 2, 3, 4), b)
    assert not disk.lookup(7, 3, (1, 2, 3, 4))
    assert disk.read(7, 3, (1, 2, 3, 4), namespace=b) is None  # only its own directory is read
    block_file = namespace_dir(tmp_path, a) / f"{7:016x}.kv"
    assert block_file.exists()  # the miss deleted nothing of a's
    assert namespace_dir(tmp_path, a).stat().st_mode & 0o777 == 0o700  # as private as the tier
    assert block_file.stat().st_mode & 0o777 == 0o600

    assert disk.purge_namespace(a) == 1
    assert not namespace_dir(tmp_path, a).exists() and not disk.lookup(7, 3, (1, 2, 3, 4), a)
    assert disk.lookup(8, 3, (1, 2, 3, 4), b) and disk.lookup(9, 0, (5, 6, 7, 8))
    assert disk.purge_namespace(0) == 0 and disk.lookup(9, 0, (5, 6, 7, 8))  # never the shared one
    disk.close()
    again = make_disk(tmp_path)  # a warm restart rebuilds the namespaces from the directories
    assert again.lookup(8, 3, (1, 2, 3, 4), b) and not again.lookup(8, 3, (1, 2, 3, 4), a)
    assert torch.equal(again.read(8, 3, (1, 2, 3, 4), namespace=b), block_value(8))
    assert again.purge_namespace(b) == 1 and not list(tmp_path.rglob(f"{8:016x}.kv"))
    again.close()


def test_a_purge_cancels_the_namespaces_queued_writes_but_not_later_ones(tmp_path: Path) -> None:
    a = cache_salt("user:1", None).namespace
    disk = make_disk(tmp_path, queue_blocks=16)
    with disk._lock:  # the writer waits: everything below is still queued at the purge
        for h in range(1, 6):
            disk.write(h, 0, (h,), block_value(h), namespace=a, force=h == 5)
        disk.write(6, 0, (6,), block_value(6))
        disk.purge_namespace(a)
        disk.write(7, 0, (7,), block_value(7), namespace=a)  # the user is still there: cached again
    disk.flush()
    assert set(disk._index) == {6, 7} and disk.used_bytes == sum(e.size for e in disk._index.values())
    assert [p.name for p in namespace_dir(tmp_path, a).glob("*")] == [f"{7:016x}.kv"]
    assert disk.enabled  # skipped writes are no write errors
    disk.close()


# ---- host tier (pinned on CUDA; plain CPU tensors here) -----------------------------------------


def test_host_tier_stores_loads_and_hands_its_lru_victims_down() -> None:
    pool = torch.zeros(4, *SHAPE, dtype=torch.float64)
    handed_down: list[int] = []
    nbytes = pool[0].numel() * 8
    host = HostTier(pool, 2 * nbytes, is_retained=lambda h: h == 1)
    host.on_evict = lambda h, parent, tokens, data, namespace: handed_down.append(h) or None
    for block_id, h in enumerate((1, 2, 3)):
        pool[block_id] = block_value(h)
        host.store(h, 0, (h,), block_id)
    assert host.num_slots == 2 and handed_down == [2]  # 1 is retained, so 2 went first
    assert host.lookup(1, 0, (1,)) and not host.lookup(1, 0, (9,))
    host.load(3, 3)
    host.before_forward()
    assert torch.equal(pool[3], block_value(3))
    assert host.stats()["bytes_read"] == nbytes and host.stats()["bytes_written"] == 3 * nbytes


def test_host_tier_purge_frees_and_zeroes_only_that_namespaces_slots() -> None:
    pool = torch.zeros(4, *SHAPE, dtype=torch.float64)
    host = HostTier(pool, 3 * pool[0].numel() * 8)
    a = cache_salt("user:1", None).namespace
    for block_id, (h, namespace) in enumerate(((1, a), (2, 0), (3, a))):
        pool[block_id] = block_value(h)
        host.store(h, 0, (h,), block_id, namespace)
    assert host.lookup(1, 0, (1,), a) and not host.lookup(1, 0, (1,))  # the namespace must match
    assert host.purge_namespace(a) == 2
    assert not host.lookup(1, 0, (1,), a) and not host.lookup(3, 0, (3,), a) and host.lookup(2, 0, (2,))
    assert len(host._free) == 2 and all(not host.slab[slot].any() for slot in host._free)


# ---- retention, cost model, victim ---------------------------------------------------------------


def test_retained_blocks_are_evicted_last_and_forced_to_the_disk(tmp_path: Path) -> None:
    pool = torch.zeros(6, *SHAPE, dtype=torch.float64)
    disk = make_disk(tmp_path, queue_blocks=1)
    bm = BlockManager(6, BS, tiers=TierStack(pool, BS, disk=disk))
    kept, other = list(range(1, 10)), list(range(50, 59))  # two full blocks each (+1 token)
    bm.retain("conv", kept)
    for tokens in (kept, other):
        seq = Sequence(tokens, len(tokens))
        bm.admit(seq, bm.match_prefix(seq))
        compute(bm, pool, seq)
        bm.free(seq)
    disk.flush()
    for h in prefix_hashes(kept, BS):
        disk._forget(h, corrupt=False)  # as if its write-through had been dropped
    newcomer = Sequence(list(range(100, 124)), 24)  # needs all 6 blocks: everything goes
    bm.admit(newcomer, [])
    assert bm.allocate_slots(newcomer, 24)
    disk.flush()
    for h in prefix_hashes(kept, BS):
        assert disk.contains(h)  # retained: written on eviction even though dropped before
    bm.free(newcomer)
    bm.release("conv")
    assert not bm.is_retained(prefix_hashes(kept, BS)[0])
    disk.close()


def test_eviction_takes_unretained_cached_blocks_before_retained_ones() -> None:
    pool = torch.zeros(6, *SHAPE, dtype=torch.float64)
    bm = BlockManager(6, BS)
    a, b = list(range(1, 10)), list(range(20, 29))
    bm.retain("a", a)
    for tokens in (a, b):
        seq = Sequence(tokens, len(tokens))
        bm.admit(seq, bm.match_prefix(seq))
        compute(bm, pool, seq)
        bm.free(seq)
    seq = Sequence(list(range(40, 53)), 13)
    bm.admit(seq, [])
    assert bm.allocate_slots(seq, 13)  # 4 blocks: two empty + b's two cached, not a's
    again = Sequence(a, len(a))
    assert len(bm.match_prefix(again)) == 2
    assert bm.match_prefix(Sequence(b, len(b))) == []


def test_cost_model_loads_and_swaps_only_when_moving_beats_recomputing(tmp_path: Path) -> None:
    pool = torch.zeros(4, 1024, dtype=torch.float32)  # 4 KiB blocks
    stack = TierStack(pool, 16, disk=make_disk(tmp_path))
    assert stack.worth_loading(["disk"])  # nothing measured yet: recompute is priced as unknown
    stack.observe_prefill(1.0, 1000)  # 1 ms per token: a block recomputes in 16 ms
    assert stack.worth_loading(["disk"] * 4)  # 4 KiB at 0.5 GB/s is 8 us
    stack.prefill_s_per_token = 1e-9  # absurdly fast recompute
    assert not stack.worth_loading(["disk"])
    assert not stack.prefer_swap(num_blocks=4, num_to_write=4, num_tokens=64)
    stack.prefill_s_per_token = 1e-3
    assert stack.prefer_swap(num_blocks=4, num_to_write=4, num_tokens=64)
    assert not stack.prefer_swap(num_blocks=0, num_to_write=0, num_tokens=3)
    stack.close()


def test_a_request_preempted_once_is_not_the_next_victim_again() -> None:
    bm = BlockManager(64, BS)
    scheduler = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64)
    requests = []
    for i in range(3):
        request = Request(f"r{i}", [1, 2, 3], SamplingParams())
        request.seqs.append(Sequence([1, 2, 3], 3, request=request))
        request.status = RequestStatus.RUNNING
        scheduler.running.append(request)
        requests.append(request)
    assert scheduler._choose_victim(set()) is requests[2]  # the newest
    requests[2].num_preemptions = 1
    assert scheduler._choose_victim(set()) is requests[1]  # not the one just preempted
    assert scheduler._choose_victim({id(requests[1])}) is requests[0]  # never one already scheduled


# ---- interleavings ----------------------------------------------------------------------------------


BASES = ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], [3, 3, 2, 2, 1, 1, 3, 3, 2, 2, 1, 1], [2] * 12)
# A shared conversation start cut anywhere, plus a few new tokens: prefixes recur.
TOKENS = st.builds(
    lambda base, cut, tail: base[:cut] + tail,
    st.sampled_from(BASES),
    st.integers(0, 12),
    st.lists(st.integers(1, 3), max_size=4),
).filter(lambda tokens: len(tokens) >= 2)
# Who sends it: unsalted, or a user's namespace salted from block 0, 1 or 2 on (the
# blocks before stay shared, as a common system prompt's do).
NAMESPACES = ("user:1", "user:2")
OWNER = st.tuples(st.sampled_from((None, *NAMESPACES)), st.integers(0, 2))


def salted_seq(tokens: list[int], owner: tuple[str | None, int]) -> Sequence:
    seq = Sequence(tokens, len(tokens))
    salt = cache_salt(owner[0], None)
    seq.cache_salt, seq.cache_namespace = salt.value, salt.namespace
    seq.cache_salt_block = owner[1] if salt.value else 0
    return seq


class TierMachine(RuleBasedStateMachine):
    """Sequences over a 3-token alphabet (so prefixes are shared), unsalted or salted by
    one of two namespaces, through a 10-block pool, a 3-slot host tier and a 24-block disk
    tier with a 6-write queue, under random admissions (prefill, or lower-tier loads
    first), aborts, pool pressure, retention, file damage and namespace purges."""

    use_host = False
    groups: tuple[KVGroup, ...] = (KVGroup(None, ()),)

    @initialize(tmp=st.just(None))
    def setup(self, tmp) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="kv-tiers-"))
        self.pool = torch.zeros(10, *SHAPE, dtype=torch.float64)
        # Built as the engine builds them: the retention registry, the tiers, the block manager.
        retention = Retention()
        self.disk = make_disk(self.dir, blocks=24, queue_blocks=6, is_retained=retention.is_retained)
        nbytes = self.pool[0].numel() * 8
        host = HostTier(self.pool, 3 * nbytes, is_retained=retention.is_retained) if self.use_host else None
        self.host = host
        tiers = TierStack(self.pool, BS, host=host, disk=self.disk)
        self.bm = BlockManager(10, BS, tiers=tiers, retention=retention, groups=self.groups)
        self.running: list[Sequence] = []
        self.loading: list[Sequence] = []
        self.keys: set[str] = set()
        self.seen: list[tuple[list[int], tuple[str | None, int]]] = []
        self.purged: set[int] = set()  # namespaces purged and not used since

    def teardown(self) -> None:
        if hasattr(self, "disk"):
            self.disk.close()
            shutil.rmtree(self.dir)

    @precondition(lambda self: self.seen)
    @rule(i=st.integers(0, 100), pressure=st.integers(0, 10), flush=st.booleans())
    def next_turn(self, i: int, pressure: int, flush: bool) -> None:
        """A conversation comes back (an earlier prompt, one token longer) after other
        traffic pushed up to ``pressure`` blocks out of the pool."""
        if flush:
            self.disk.flush()
        self.evict(pressure)
        tokens, owner = self.seen[i % len(self.seen)]
        self.admit(tokens + [1], owner)
        if self.loading and flush:
            self.finish_loading(len(self.loading) - 1)

    @rule(tokens=TOKENS, owner=OWNER)
    def admit(self, tokens: list[int], owner: tuple[str | None, int]) -> None:
        self.seen.append((tokens, owner))
        bm = self.bm
        if len(self.running) >= 2:  # the oldest finishes: the pool keeps turning over
            bm.free(self.running.pop(0))
        seq = salted_seq(tokens, owner)
        hits = bm.match_prefix(seq)
        lower = bm.match_lower(seq, len(hits))
        new_blocks = bm.num_groups * (bm.blocks_for(len(tokens)) - len(hits))
        if bm.num_revived(hits, seq) + new_blocks > bm.num_free_blocks:
            return
        self.purged.discard(seq.cache_namespace)  # its blocks may be cached again from here on
        bm.admit(seq, hits)
        if lower:
            bm.start_loads(seq, lower)
            self.loading.append(seq)
        else:
            compute(bm, self.pool, seq)  # its prefill
            self.running.append(seq)

    # No precondition may read ``loading`` or ``running``: which admissions load from a tier
    # depends on how far the disk's I/O thread got, and Hypothesis needs the same rules
    # enabled when it replays a case. These rules do nothing when their list is empty.
    @rule(i=st.integers(0, 100))
    def finish_loading(self, i: int) -> None:
        if not self.loading:
            return
        seq = self.loading.pop(i % len(self.loading))
        for load in seq.pending_loads:
            if load.future is not None:
                load.future.result()
        before = seq.num_computed_tokens
        served = self.bm.complete_loads(seq)
        hashes = prefix_hashes(seq.token_ids, BS, seq.cache_salt, seq.cache_salt_block)
        for j in range(before // BS, (before + served) // BS):
            # Served from a tier: exactly what was computed for these tokens (in every group).
            for g, table in enumerate(self.bm.tables(seq)):
                if table[j] != NO_BLOCK:
                    assert torch.equal(self.pool[table[j]], block_value(hashes[j], g))
        if self.bm.blocks_needed(seq, seq.num_tokens - seq.num_computed_tokens) <= self.bm.num_free_blocks:
            compute(self.bm, self.pool, seq)  # the prefill of what no tier had
        self.running.append(seq)

    @rule(i=st.integers(0, 100), tokens=st.lists(st.integers(1, 3), min_size=1, max_size=6))
    def decode(self, i: int, tokens: list[int]) -> None:
        """A running sequence generates more tokens; the blocks they fill are published."""
        if not self.running:
            return
        seq = self.running[i % len(self.running)]
        if self.bm.blocks_needed(seq, seq.num_tokens + len(tokens) - seq.num_computed_tokens) > (
            self.bm.num_free_blocks
        ):
            return
        seq.token_ids += tokens
        compute(self.bm, self.pool, seq)

    @rule(blocks=st.integers(1, 10))
    def evict(self, blocks: int) -> None:
        """Pool pressure: a sequence takes up to ``blocks`` free blocks (evicting cached
        ones, least recently used first) and leaves before they are computed."""
        blocks = min(blocks, self.bm.num_free_blocks // self.bm.num_groups)
        if blocks:
            seq = Sequence([7] * (blocks * BS), blocks * BS)
            self.bm.admit(seq, [])
            assert self.bm.allocate_slots(seq, blocks * BS)
            self.bm.free(seq)

    @rule(i=st.integers(0, 100), loading=st.booleans())
    def abort(self, i: int, loading: bool) -> None:
        if not (self.running or self.loading):
            return
        group = self.loading if (loading and self.loading) or not self.running else self.running
        seq = group.pop(i % len(group))
        self.bm.free(seq)
        seq.pending_loads = []

    @rule(key=st.sampled_from(["a", "b", "c"]), tokens=TOKENS, owner=OWNER)
    def retain(self, key: str, tokens: list[int], owner: tuple[str | None, int]) -> None:
        seq = salted_seq(tokens, owner)
        self.bm.retain(key, tokens, seq.cache_salt, seq.cache_salt_block)
        self.keys.add(key)

    @precondition(lambda self: self.keys)
    @rule(key=st.sampled_from(["a", "b", "c"]))
    def release(self, key: str) -> None:
        self.bm.release(key)
        self.keys.discard(key)

    @rule()
    def flush_writes(self) -> None:
        self.disk.flush()

    @rule(i=st.integers(0, 100))
    def damage_a_file(self, i: int) -> None:
        files = sorted(self.dir.rglob("*.kv"))
        if files:
            path = files[i % len(files)]
            try:
                raw = bytearray(path.read_bytes())
            except FileNotFoundError:
                return  # the I/O thread evicted (or a purge deleted) it since the listing
            raw[-1] ^= 0xFF
            path.write_bytes(bytes(raw))

    @rule(name=st.sampled_from(NAMESPACES), flush=st.booleans())
    def purge(self, name: str, flush: bool) -> None:
        """A user is deleted: as ``LLMEngine.purge_namespace`` does, their sequences still
        running publish nothing more, and every tier drops the namespace's blocks."""
        namespace = cache_salt(name, None).namespace
        for seq in self.running + self.loading:
            if seq.cache_namespace == namespace:
                seq.cache_private = True
        self.bm.purge_namespace(namespace)
        self.purged.add(namespace)
        if flush:  # writes queued before the purge are skipped, never land
            self.disk.flush()
            assert not self.disk._pending  # cancelled writes are no longer waited for
            assert not list(namespace_dir(self.dir, namespace).glob("*.kv"))
        for tokens, owner in self.seen:
            if owner[0] == name:
                seq = salted_seq(tokens + [1], owner)
                hits = self.bm.match_prefix(seq)
                lower = self.bm.match_lower(seq, len(hits))
                # Only the unsalted blocks before the salt's start can still be found.
                assert len(hits) + len(lower) // self.bm.num_groups <= owner[1]

    @invariant()
    def purged_namespaces_are_in_no_tier(self) -> None:
        if not hasattr(self, "bm"):
            return
        for namespace in self.purged:
            assert all(b.namespace != namespace for b in self.bm.blocks if b.hash is not None)
            if self.host is not None:
                assert all(e.namespace != namespace for e in self.host._index.values())
            with self.disk._lock:
                assert all(e.namespace != namespace for e in self.disk._index.values())

    @invariant()
    def ref_counts_balance_and_nothing_leaks(self) -> None:
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        held = Counter(
            b for s in self.running + self.loading for t in bm.tables(s) for b in t if b != NO_BLOCK
        )
        for block in bm.blocks:
            assert block.ref_count == held.get(block.block_id, 0)
        free = set(bm._empty) | set(bm._cached_free) | set(bm._retained_free)
        assert len(free) == len(bm._empty) + len(bm._cached_free) + len(bm._retained_free)
        assert free == {b.block_id for b in bm.blocks if b.ref_count == 0}
        assert bm.num_free_blocks + len(held) == bm.num_blocks
        for block_id in bm._retained_free:
            assert bm.is_retained(bm.blocks[block_id].hash)
        for block_id in bm._cached_free:
            assert not bm.is_retained(bm.blocks[block_id].hash)
        for block_id in bm._empty:
            assert bm.blocks[block_id].hash is None

    @invariant()
    def cached_blocks_hold_what_their_hash_says(self) -> None:
        if not hasattr(self, "bm"):
            return
        for g, by_hash in enumerate(self.bm._hash_maps):
            for h, block_id in by_hash.items():
                block = self.bm.blocks[block_id]
                assert block.hash == h and block.group == g
                assert torch.equal(self.pool[block_id], block_value(h, g))

    @invariant()
    def disk_index_matches_its_bound(self) -> None:
        if not hasattr(self, "disk"):
            return
        with self.disk._lock:
            assert self.disk.used_bytes == sum(e.size for e in self.disk._index.values())
            assert self.disk.used_bytes <= self.disk.capacity_bytes


class TierMachineWithHost(TierMachine):
    use_host = True


class SlidingTierMachine(TierMachine):
    """The same, on a pool shared by a full-attention group and a sliding one (window 5):
    the sliding group's blocks leave the pool as sequences grow, go down the tiers like
    any other, and come back only where a prefix's last window needs them."""

    use_host = True
    groups = (KVGroup(None, (0,)), KVGroup(5, (1,)))


_settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
TestTierInterleavings = TierMachine.TestCase
TestTierInterleavings.settings = _settings
TestTierInterleavingsWithHost = TierMachineWithHost.TestCase
TestTierInterleavingsWithHost.settings = _settings
TestTierInterleavingsSliding = SlidingTierMachine.TestCase
TestTierInterleavingsSliding.settings = _settings


def test_files_written_match_the_index_after_flush(tmp_path: Path) -> None:
    disk = make_disk(tmp_path, blocks=5)
    for h in range(1, 9):
        disk.write(h, 0, (h,), block_value(h))
    disk.flush()
    names = {p.name for p in tmp_path.glob("*.kv")}
    assert names == {f"{h:016x}.kv" for h in disk._index} and len(names) <= 5
    assert not list(tmp_path.glob("*.tmp")) and os.path.exists(tmp_path / FINGERPRINT_FILE)
    disk.close()
