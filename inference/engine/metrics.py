"""Counters and latency histograms the engine keeps for monitoring.

Plain numbers, no exporter: the site turns an ``EngineStats`` snapshot into Prometheus
text (``conversations/ops/metrics.py``), so ``inference/`` needs no metrics library and
every process's figures come from the one engine thread that owns them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Seconds; time to first token spans queueing and long prefills, time per output token
# one decode step.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("stop", "length", "abort", "error", "rejected")


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

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
