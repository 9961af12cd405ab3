"""The seams between the scheduler and the KV cache, pinned without a model: the retention
registry the block manager and the tiers share, the typed blocks the scheduler sees, the
tiers' own swap and load policy, step-local planning state, and collaborators given at
construction."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Request, Sequence
from inference.engine.step_budget import PromptAllowance, StepBudget
from inference.kv.block_manager import BlockManager
from inference.kv.blocks import CachedBlock, PrefixBlocks
from inference.kv.chain_hash import prefix_hashes
from inference.kv.retention import Retention
from inference.kv.tiers import TierStack
from inference.pd.scheduler import DisaggregatedScheduler
from inference.pd.workers import WorkerPool
from inference.sampling.params import SamplingParams
from tests.engine.test_kv_tiers_unit import BS, SHAPE, compute, make_disk


def test_retention_counts_keys_per_hash_and_reports_what_one_unmark_releases() -> None:
    retention = Retention()
    retention.mark("a", [1, 2, 3])
    retention.mark("b", [1, 2])
    assert retention.is_retained(3) and retention.num_keys == 2 and retention.num_hashes == 3
    assert set(retention.keys()) == {"a", "b"} and retention.hashes("b") == [1, 2]
    assert retention.unmark("a") == [3]  # 1 and 2 are still b's
    assert retention.unmark("b") == [1, 2] and retention.unmark("b") == []
    assert retention.hashes("a") == [] and not retention.is_retained(1)


def test_a_block_manager_shares_the_retention_it_is_built_with() -> None:
    retention = Retention()
    bm = BlockManager(8, BS, retention=retention)
    tokens = list(range(1, 10))
    assert bm.retain("conv", tokens) == 2
    assert retention.hashes("conv") == prefix_hashes(tokens, BS)
    assert all(retention.is_retained(h) for h in prefix_hashes(tokens, BS))
    bm.release("conv")
    assert retention.num_keys == 0 and bm.num_retained_blocks == 0
    assert BlockManager(8, BS).retention is not BlockManager(8, BS).retention  # private by default


# ---- typed blocks and the tiers' policy ------------------------------------------------------------


def computed(bm: BlockManager, pool: torch.Tensor, tokens: list[int]) -> Sequence:
    seq = Sequence(list(tokens), len(tokens))
    bm.admit(seq, bm.match_prefix(seq))
    compute(bm, pool, seq)
    return seq


def test_registered_blocks_are_frozen_cached_blocks_in_order() -> None:
    pool = torch.zeros(6, *SHAPE, dtype=torch.float64)
    bm = BlockManager(6, BS)
    seq = computed(bm, pool, list(range(1, 10)))  # two full blocks and one token
    h = prefix_hashes(seq.token_ids, BS)
    table = seq.block_table
    assert bm.registered_blocks(seq) == [
        CachedBlock(block_hash=h[0], parent_hash=0, token_ids=(1, 2, 3, 4), block_id=table[0], namespace=0),
        CachedBlock(
            block_hash=h[1], parent_hash=h[0], token_ids=(5, 6, 7, 8), block_id=table[1], namespace=0
        ),
    ]
    with pytest.raises(FrozenInstanceError):
        bm.registered_blocks(seq)[0].block_id = 5  # type: ignore[misc]


def test_the_tiers_decide_a_swap_and_write_down_only_what_no_tier_holds(tmp_path: Path) -> None:
    pool = torch.zeros(6, *SHAPE, dtype=torch.float64)
    disk = make_disk(tmp_path)
    tiers = TierStack(pool, BS, disk=disk)
    bm = BlockManager(6, BS, tiers=tiers)
    seq = computed(bm, pool, list(range(1, 10)))
    disk.flush()  # both blocks written through
    first, second = prefix_hashes(seq.token_ids, BS)
    disk._forget(second, corrupt=False)  # as if its write-through had been dropped
    tiers.prefill_s_per_token = 1e-12  # recomputing is nearly free: no swap, nothing written
    assert not bm.swap_out(seq)
    disk.flush()
    assert not disk.contains(second)
    tiers.prefill_s_per_token = 1.0  # recomputing is dear: swap, writing the missing block
    assert bm.swap_out(seq)
    disk.flush()
    assert disk.contains(first) and disk.contains(second)
    assert not BlockManager(6, BS).swap_out(seq)  # no tiers: always recomputed
    disk.close()


def test_a_prefix_is_offered_for_loading_only_when_the_tiers_say_reading_wins(tmp_path: Path) -> None:
    pool = torch.zeros(6, *SHAPE, dtype=torch.float64)
    disk = make_disk(tmp_path)
    tiers = TierStack(pool, BS, disk=disk)
    bm = BlockManager(6, BS, tiers=tiers)
    tokens = list(range(1, 14))  # three full blocks and one token
    bm.free(computed(bm, pool, tokens))  # tail first: the third block is the oldest cached one
    disk.flush()
    pressure = Sequence([7] * 20, 20)  # five blocks: the empty ones, then the two newest tails
    bm.admit(pressure, [])
    assert bm.allocate_slots(pressure, 20)
    bm.free(pressure)
    seq = Sequence(tokens, len(tokens))
    prefix = bm.prefix_to_load(seq)  # nothing measured yet: recomputing is priced as unknown
    assert prefix == PrefixBlocks(hits=tuple(bm.match_prefix(seq)), lower=("disk", "disk"), num_revived=1)
    assert len(prefix.hits) == 1 and prefix.num_to_take == 3
    tiers.prefill_s_per_token = 1e-12
    assert bm.prefix_to_load(seq) is None  # recomputing wins
    assert BlockManager(6, BS).prefix_to_load(seq) is None  # no tiers
    disk.close()


# ---- step-local planning state ---------------------------------------------------------------------


def new_request(request_id: str, tokens: list[int]) -> Request:
    request = Request(request_id, tokens, SamplingParams())
    request.seqs.append(Sequence(list(tokens), len(tokens), request=request))
    return request


def test_each_step_plans_with_its_own_prompt_allowance_and_keeps_none_of_it() -> None:
    budget = StepBudget(0.15, 64, min_chunk=4, first_chunk=8)
    budget.observe = lambda *a: None  # type: ignore[method-assign] # keep the limit at first_chunk
    scheduler = Scheduler(BlockManager(64, BS), 64, 8, 256, step_budget=budget)
    counted: list[int] = []
    count = scheduler._prefill_limit

    def counting() -> int | None:
        counted.append(1)
        return count()

    scheduler._prefill_limit = counting  # type: ignore[method-assign]
    decoding = new_request("d", [1, 2, 3])
    scheduler.add(decoding)
    scheduler.finish_step(scheduler.schedule())  # its prompt, nobody decoding: no limit
    scheduler.add(new_request("p", list(range(10, 40))))
    attributes = set(vars(scheduler))
    counted.clear()
    for _ in range(3):
        decoding.seqs[0].token_ids.append(5)  # it sampled: one token to run
        batch = scheduler.schedule()
        assert batch.num_new_tokens == [1, 8]  # the whole allowance again: nothing carried over
        scheduler.finish_step(batch)
        assert set(vars(scheduler)) == attributes
        assert not any(isinstance(v, PromptAllowance) for v in vars(scheduler).values())
    assert counted == [1, 1, 1]  # counted once a step, at its prompt chunk


def test_a_prompt_allowance_is_counted_at_the_first_chunk_and_spent_by_prompt_chunks() -> None:
    calls: list[int] = []
    allowance = PromptAllowance(lambda: calls.append(1) or 10)
    allowance.spend(1)  # a decode before any chunk: nothing counted, nothing spent
    assert calls == [] and allowance.left is None
    assert allowance.cap(64) == 10 and calls == [1]
    allowance.spend(1)
    allowance.spend(6)
    assert allowance.cap(64) == 4 and calls == [1]
    allowance.spend(9)
    assert allowance.cap(64) == 0
    assert PromptAllowance(lambda: None).cap(64) == 64  # nobody decoding: no limit


# ---- collaborators at construction -------------------------------------------------------------------


def test_the_engine_builds_each_part_with_its_collaborators(tiny, tmp_path: Path) -> None:
    """The tiers, the block manager and the scheduler are built whole: the block manager
    holds the tiers and the retention registry they read, the scheduler its step budget."""
    engine = tiny.engine(kv_disk_dir=str(tmp_path), step_budget_ms=150.0)
    bm, tiers = engine.block_manager, engine.tiers
    assert tiers is not None and bm.tiers is tiers and engine.scheduler.block_manager is bm
    assert tiers.disk is not None and tiers.disk.is_retained == bm.retention.is_retained
    assert engine.scheduler.step_budget is not None and engine.scheduler.step_budget.budget_s == 0.15
    assert tiny.engine(step_budget_ms=0.0).scheduler.step_budget is None
    engine.close()


def test_a_disaggregated_scheduler_is_built_with_its_pool_and_workers() -> None:
    pool = torch.zeros(8, *SHAPE)
    workers = WorkerPool([], 2, 60.0)
    budget = StepBudget(0.15, 64)
    scheduler = DisaggregatedScheduler(
        BlockManager(8, BS),
        64,
        4,
        128,
        kv_cache=pool,
        workers=workers,
        min_prompt_tokens=256,
        step_budget=budget,
    )
    assert scheduler.kv_cache is pool and scheduler.workers is workers and scheduler.step_budget is budget
