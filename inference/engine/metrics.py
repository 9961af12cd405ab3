"""Counters and latency histograms the engine keeps for monitoring.

Plain numbers, no exporter: the site turns an ``EngineStats`` snapshot into Prometheus
text (``conversations/ops/metrics.py``), so ``inference/`` needs no metrics library and
every process's figures come from the one engine thread that owns them.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.sequence import Request

# Seconds; time to first token spans queueing and long prefills, time per output token
# one decode step.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("stop", "length", "abort", "error", "rejected")
RATE_WINDOW_S = 10.0  # tokens_per_s averages over this many recent seconds


@dataclass
class LatencyHistogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative) + one for +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def as_dict(self) -> dict:
        return {
            "buckets": list(self.buckets),
            "counts": list(self.counts),
            "sum": self.total,
            "count": self.count,
        }


@dataclass
class EngineMetrics:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    ttft: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(TTFT_BUCKETS))
    tpot: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(TPOT_BUCKETS))
    cached_tokens: int = 0  # prompt tokens served from any tier at first admission
    num_steps: int = 0
    total_prompt_tokens: int = 0
    total_generated_tokens: int = 0
    total_computed_tokens: int = 0  # tokens the model ran (prefill + decode), recomputation included
    # KV pool use: token slots holding K/V after the latest step's writes, and the peak
    # of blocks in use with the share of their slots left empty at that moment.
    kv_slots_used: int = 0
    peak_kv_blocks_used: int = 0
    kv_waste_at_peak: float = 0.0
    recent_steps: deque[tuple[float, float, int]] = field(default_factory=deque)  # (start, end, generated)
    recent_generated: int = 0  # the sum of recent_steps' generated counts

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def observe_step(self, started: float, num_computed: int, num_generated: int) -> None:
        self.num_steps += 1
        self.total_computed_tokens += num_computed
        self.total_generated_tokens += num_generated
        self.recent_steps.append((started, time.monotonic(), num_generated))
        self.recent_generated += num_generated

    def observe_kv_usage(self, used_blocks: int, used_slots: int, block_size: int) -> None:
        self.kv_slots_used = used_slots
        if used_blocks > self.peak_kv_blocks_used:
            self.peak_kv_blocks_used = used_blocks
            self.kv_waste_at_peak = 1 - used_slots / (used_blocks * block_size)

    def observe_first_token(self, request: Request, now: float) -> None:
        """Once per request, when its first token is sampled."""
        if request.first_token_time is None:
            request.first_token_time = now
            self.ttft.observe(now - request.arrival_time)
            self.cached_tokens += request.num_cached_tokens

    def observe_finished(self, request: Request) -> None:
        """A request ran to its end: its outcome (the first output's finish reason) and TPOT."""
        outputs = request.outputs_in_order()
        self.count((outputs[0].finish_reason if outputs else None) or "stop")
        decoded = max((s.num_output_tokens for s in outputs), default=0) - 1
        if decoded > 0 and request.first_token_time is not None and request.finish_time is not None:
            self.tpot.observe((request.finish_time - request.first_token_time) / decoded)

    def tokens_per_s(self, now: float | None = None) -> float:
        """Generated tokens per second over the last ``RATE_WINDOW_S`` (0 when idle that long)."""
        now = time.monotonic() if now is None else now
        recent = self.recent_steps
        while recent and recent[0][1] < now - RATE_WINDOW_S:
            self.recent_generated -= recent.popleft()[2]
        if not recent:
            return 0.0
        span = now - recent[0][0]
        return self.recent_generated / span if span > 0 else 0.0
