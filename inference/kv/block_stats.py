"""The pool's block counts, as the block manager reports them and the tiers' stats extend them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BlockStats:
    total: int
    used: int  # held by at least one sequence
    cached: int  # free, but holding a revivable prefix
    free: int  # free and empty
    hit_tokens: int  # prompt tokens served from the cache (first admissions)
    queried_tokens: int  # prompt tokens looked up

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
