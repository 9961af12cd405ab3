"""The engine's live figures: KV slot use after a step, and the ``EngineStats`` snapshot."""

from __future__ import annotations

from inference.engine.metrics import EngineMetrics
from inference.engine.outputs import EngineStats
from inference.engine.scheduler import Scheduler
from inference.kv.tiers import TierStack, tier_stats
from inference.runner.cuda_graphs import CUDAGraphRunner


def observe_kv_usage(metrics: EngineMetrics, scheduler: Scheduler) -> None:
    """Token slots holding K/V versus blocks in use, once the step's tokens are cached
    (after ``Scheduler.finish_step``): only each sequence's last block can be partly filled.
    Sequences of one request share blocks once forked, so their tails count once each, at
    their fullest; another request's partial tail is its own (the prefix cache shares full
    blocks only). A model with several KV groups has a tail in each group's table."""
    block_manager = scheduler.block_manager
    bs = block_manager.block_size
    partial_slots = partial_blocks = 0
    forked_tails: dict[int, int] = {}
    for request in scheduler.running:
        seqs = request.seqs
        if len(seqs) == 1 and not request.forked:
            for table in block_manager.tables(seqs[0]):
                if table:
                    fill = seqs[0].num_computed_tokens - (len(table) - 1) * bs
                    if fill < bs:
                        partial_slots += fill
                        partial_blocks += 1
            continue
        for seq in seqs:
            for table in block_manager.tables(seq):
                if table:
                    block, fill = table[-1], seq.num_computed_tokens - (len(table) - 1) * bs
                    forked_tails[block] = max(forked_tails.get(block, 0), fill)
    for fill in forked_tails.values():
        if fill < bs:
            partial_slots += fill
            partial_blocks += 1
    used = block_manager.num_blocks - block_manager.num_free_blocks
    metrics.observe_kv_usage(used, (used - partial_blocks) * bs + partial_slots, bs)


def engine_stats(
    scheduler: Scheduler,
    metrics: EngineMetrics,
    tiers: TierStack | None,
    cuda_graphs: CUDAGraphRunner | None,
) -> EngineStats:
    block_manager = scheduler.block_manager
    blocks = block_manager.stats()
    extra: dict[str, float] = {
        "peak_kv_blocks_used": metrics.peak_kv_blocks_used,
        "kv_waste_at_peak": metrics.kv_waste_at_peak,
    }
    budget = scheduler.step_budget
    if budget is not None:  # the step time budget's measured rates (inference.engine.step_budget)
        extra["prefill_tokens_per_s"] = budget.prefill_tokens_per_s
        extra["decode_step_ms"] = budget.decode_step_s * 1000
    if cuda_graphs is not None:
        extra["cuda_graph_steps"] = cuda_graphs.num_replays
    return EngineStats(
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        kv_blocks_total=blocks.total,
        kv_blocks_used=blocks.used,
        kv_blocks_cached=blocks.cached,
        kv_blocks_free=blocks.free,
        kv_block_size=block_manager.block_size,
        kv_slots_used=metrics.kv_slots_used if blocks.used else 0,
        prefix_hit_rate=blocks.hit_rate,
        prefix_hit_tokens=blocks.hit_tokens,
        prefix_queried_tokens=blocks.queried_tokens,
        tokens_per_s=metrics.tokens_per_s(),
        total_generated_tokens=metrics.total_generated_tokens,
        total_prompt_tokens=metrics.total_prompt_tokens,
        num_preemptions=scheduler.num_preemptions,
        num_steps=metrics.num_steps,
        loading=len(scheduler.loading),
        num_swaps=scheduler.num_swaps,
        cached_tokens=metrics.cached_tokens,
        kv_retained_keys=block_manager.num_retained_keys,
        kv_retained_blocks=block_manager.num_retained_blocks,
        requests_by_outcome=dict(metrics.outcomes),
        ttft=metrics.ttft.as_dict(),
        tpot=metrics.tpot.as_dict(),
        kv_tiers=tier_stats(blocks, tiers),
        disaggregation=scheduler.disaggregation_stats(),
        extra=extra,
    )
