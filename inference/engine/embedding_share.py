"""A hard share of the engine thread's time for embedding work while requests run.

Embedding jobs advance one chunk per turn, after a step (``inference.engine.embedding_jobs``).
While any request is unfinished, the turns are paid from a time account instead of being
sized like a step's prompt tokens: every second the engine spends outside embedding turns
(steps, handing tokens out) earns ``share`` seconds of credit, and a turn runs only once
the credit holds ``turn_s`` (a whole turn's worth: a chunk's forward streams every weight
once, so fewer, larger chunks do more per second than one tiny chunk after every step).
The turn's chunk is sized to the credit at the rate embedding chunks were measured to
run, and its time is charged whatever it was: a chunk that ran longer than planned (deep
in a long input, a busy machine) leaves a debt that the next turns wait out.

So, over any stretch with requests running, embedding takes at most ``share`` of the
engine's time plus one chunk, and no turn is planned past ``turn_s``: decodes are never
starved, whatever the chunk rate estimates say. With nothing running nobody waits, and a
turn takes a full step's tokens (``None``: no limit).

The clock is a parameter so the accounting is testable without timing anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

EMBED_SHARE = 0.2  # embedding seconds per second of other engine work while requests run
# A turn is planned to take at most this share of the step budget (ENGINE_STEP_BUDGET_MS).
EMBED_TURN_SHARE_OF_BUDGET = 0.5
EWMA = 0.3  # weight of the newest chunk in the measured rate


@dataclass
class EmbeddingShare:
    turn_s: float  # the seconds one turn is planned to take (the credit a turn waits for)
    share: float = EMBED_SHARE
    clock: Callable[[], float] = time.monotonic
    credit_s: float = 0.0
    s_per_token: float | None = None  # embedding chunks' measured cost, any input
    _mark: float | None = None  # when the latest turn ended (None: nothing was running)
    _turn_started: float | None = None

    def allowance(self, busy: bool) -> float | None:
        """Seconds the turn starting now may take: ``None`` (no limit) when nothing is
        running (``busy`` False), 0.0 when it must wait for credit (skip the turn)."""
        now = self.clock()
        if not busy:
            self.credit_s, self._mark, self._turn_started = 0.0, None, None
            return None
        if self._mark is not None:
            self.credit_s = min(self.turn_s, self.credit_s + self.share * max(0.0, now - self._mark))
        self._mark = now
        if self.credit_s < self.turn_s - 1e-9:  # (float sums of the steps)
            return 0.0
        self._turn_started = now
        return self.credit_s

    def tokens(self, seconds: float, fallback: int, least: int) -> int:
        """The tokens that fit ``seconds`` at embedding chunks' measured rate (``fallback``
        before any chunk was measured), at least ``least``: a forward's fixed cost makes
        fewer a waste. A carried input's own rate cuts it further (``fit_chunk``)."""
        if not self.s_per_token:
            return max(least, fallback)
        return max(least, int(seconds / self.s_per_token))

    def charge(self, tokens: int) -> None:
        """The turn started by ``allowance`` ran ``tokens``: its time comes off the credit
        (a debt when it overran) and into the measured rate."""
        if self._turn_started is None:
            return
        now = self.clock()
        elapsed, self._turn_started = now - self._turn_started, None
        self.credit_s -= elapsed
        self._mark = now
        if tokens > 0 and elapsed > 0:
            sample = elapsed / tokens
            self.s_per_token = (
                sample if self.s_per_token is None else (1 - EWMA) * self.s_per_token + EWMA * sample
            )
