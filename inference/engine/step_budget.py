"""A time budget per step: how many prompt tokens the next step may carry.

A step runs the decodes of every running stream together with prompt chunks, so a
large chunk makes every stream wait for it (2,048 prompt tokens take seconds on a
CPU). While some stream is decoding, the prompt tokens of the next step are sized so
that the step takes about ``budget_s``:

    prefill tokens = (budget_s - decode step time) / prefill seconds per token

Both terms are measured, as exponentially weighted averages over recent steps: the
time of steps that carried only decodes, and, for steps with prompt tokens, their time
beyond the decode part divided by those tokens. With no stream decoding nobody waits,
so a step takes full chunks (``None``: no limit). Prompts then take a few more steps
to prefill; streams stop freezing.

When the decodes alone fill the budget (many streams, long histories, a busy machine),
the formula leaves no room, and a fixed floor of 32 tokens would make a 1,000-token
prompt wait some 30 steps, each as long as the decodes' part: new turns starve while
the running ones stream. So the prompt tokens also get a share of the decode time,
``prefill_share × decode step time / prefill seconds per token``: the decodes slow by
at most that share, and prompts progress at a rate that does not collapse with load.

The clock is a parameter so the logic is testable without timing anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

EWMA = 0.3  # weight of the newest step
MIN_CHUNK = 32  # prompt tokens a step always may take, so prompts progress on any machine
FIRST_CHUNK = 256  # before any prefill was measured
# Prompt time a step may add, as a share of its decode time, when the decodes alone
# fill the budget: the streams then slow by at most this factor.
PREFILL_SHARE = 0.5


@dataclass
class StepBudget:
    budget_s: float
    max_tokens: int  # the step's token budget (EngineConfig.max_num_batched_tokens)
    min_chunk: int = MIN_CHUNK
    first_chunk: int = FIRST_CHUNK
    prefill_share: float = PREFILL_SHARE
    clock: Callable[[], float] = time.monotonic
    prefill_s_per_token: float | None = None
    decode_step_s: float = 0.0
    _started: float | None = field(default=None, repr=False)

    def prefill_limit(self, num_decoding: int) -> int | None:
        """Prompt tokens the next step may take (None: no limit, nobody is decoding)."""
        if self.budget_s <= 0 or num_decoding == 0:
            return None
        if self.prefill_s_per_token is None:
            return max(self.min_chunk, min(self.max_tokens, self.first_chunk))
        spare = max(self.budget_s - self.decode_step_s, self.prefill_share * self.decode_step_s)
        tokens = int(spare / self.prefill_s_per_token + 1e-6) if spare > 0 else 0
        return max(min(self.min_chunk, self.max_tokens), min(self.max_tokens, tokens))

    def chunk_seconds(self, tokens: int) -> float | None:
        """The time ``tokens`` prompt tokens take at the measured prefill rate, or before any
        prefill was measured the budget's spare after a decode step (None: no budget)."""
        if self.budget_s <= 0:
            return None
        if self.prefill_s_per_token is None:
            return max(0.0, self.budget_s - self.decode_step_s)
        return tokens * self.prefill_s_per_token

    def start(self) -> None:
        """The step begins (called when it is scheduled)."""
        self._started = self.clock()

    def observe(self, prefill_tokens: int, decode_tokens: int) -> None:
        """The step's model run is done: fold its time into the averages."""
        if self._started is None:
            return
        elapsed, self._started = self.clock() - self._started, None
        if prefill_tokens == 0:
            if decode_tokens:
                self.decode_step_s = _ewma(self.decode_step_s or None, elapsed)
            return
        # The decode part of a mixed step is estimated by the decode-only average.
        decode_part = self.decode_step_s if decode_tokens else 0.0
        per_token = max(elapsed - decode_part, elapsed * 0.1) / prefill_tokens
        self.prefill_s_per_token = _ewma(self.prefill_s_per_token, per_token)

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1.0 / self.prefill_s_per_token if self.prefill_s_per_token else 0.0


@dataclass(slots=True)
class PromptAllowance:
    """One step's prompt tokens under the time budget, while that step is planned.

    ``Scheduler.schedule`` makes a fresh one per step and drops it when the step is
    planned, so nothing of one step's plan carries into the next. The limit is worked out
    (``count``: a pass over the decoding requests) at the step's first prompt chunk
    only: a step of decodes never needs it."""

    count: Callable[[], int | None]
    left: int | None = None  # prompt tokens still allowed (None: no limit)
    counted: bool = False

    def cap(self, budget: int) -> int:
        """``budget`` (the step's tokens left) cut to what a prompt chunk may take."""
        if not self.counted:
            self.left, self.counted = self.count(), True
        return budget if self.left is None else min(budget, self.left)

    @property
    def spent(self) -> bool:
        """Was the limit worked out, and are no prompt tokens left under it?"""
        return self.counted and self.left == 0

    def spend(self, num_new_tokens: int) -> None:
        """A sequence got ``num_new_tokens`` in this step (a prompt chunk when more than one)."""
        if self.left is not None and num_new_tokens > 1:
            self.left = max(0, self.left - num_new_tokens)


def _ewma(previous: float | None, sample: float) -> float:
    return sample if previous is None else (1 - EWMA) * previous + EWMA * sample


def count_tokens(num_new_tokens: list[int]) -> tuple[int, int]:
    """(prompt tokens, decode tokens) of a step: a sequence given one token decodes."""
    prefill = sum(n for n in num_new_tokens if n > 1)
    return prefill, sum(1 for n in num_new_tokens if n == 1)
