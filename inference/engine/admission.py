"""The gate in front of the waiting queue: the one place requests are turned away.

A request is refused when its prompt can never run (``PromptTooLongError``, or
``InvalidPromptError`` for a token id outside the vocabulary, which would otherwise fail
the whole step and every request in it) or when ``max_waiting`` requests are already
queued (``EngineOverloadedError``); each refusal counts once as the "rejected" outcome. ``LLMEngine.add_request`` and
``AsyncEngine.stream`` admit through it, and ``LLM.generate`` asks it whether the queue
has room before feeding the next prompt.

It only reads the scheduler's queue length and prompt limit, so other threads
(``AsyncEngine.stream``) may call it; ``add_request`` checks again on the engine thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from inference.errors import EngineOverloadedError, InvalidPromptError, PromptTooLongError

if TYPE_CHECKING:
    from inference.engine.metrics import EngineMetrics
    from inference.engine.scheduler import Scheduler


class Admission:
    def __init__(
        self, scheduler: Scheduler, max_waiting: int, metrics: EngineMetrics, vocab_size: int
    ) -> None:
        self.scheduler = scheduler
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.vocab_size = vocab_size  # rows of the embedding: the ids the model can take

    # ---- checks that count nothing: asking is not being turned away ----------------------
    def check_prompt(self, token_ids: list[int]) -> None:
        """Raise ``PromptTooLongError`` or ``InvalidPromptError`` for a prompt that can
        never run (``ValueError`` for an empty one)."""
        self.scheduler.check_prompt(len(token_ids))
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            position = next(i for i, t in enumerate(token_ids) if not 0 <= t < self.vocab_size)
            raise InvalidPromptError(token_ids[position], position, self.vocab_size)

    def num_waiting(self, pending: int = 0) -> int:
        """Queued requests, plus ``pending`` on their way to the queue."""
        return len(self.scheduler.waiting) + pending

    def has_room(self, pending: int = 0) -> bool:
        return self.num_waiting(pending) < self.max_waiting

    # ---- admission: a refusal is counted as "rejected" -----------------------------------
    def admit(self, token_ids: list[int], pending: int = 0) -> None:
        """Raise unless a request with this prompt may join the queue now."""
        self.admit_prompt(token_ids)
        self.admit_to_queue(pending)

    def admit_prompt(self, token_ids: list[int]) -> None:
        with self._counting_rejections():
            self.check_prompt(token_ids)

    def admit_to_queue(self, pending: int = 0) -> None:
        """Raise ``EngineOverloadedError`` when the queue (with ``pending`` adds) is full."""
        with self._counting_rejections():
            if not self.has_room(pending):
                raise EngineOverloadedError(f"{self.num_waiting(pending)} requests are already waiting")

    @contextmanager
    def _counting_rejections(self) -> Iterator[None]:
        try:
            yield
        except (PromptTooLongError, InvalidPromptError, EngineOverloadedError):
            self.metrics.count("rejected")
            raise
