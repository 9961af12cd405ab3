"""A chat answer's deltas, handled as the engine hands them over.

The engine calls ``put_nowait`` on the event loop's thread, within each hand-over, with the
answer's new tokens and text (``AsyncEngine.submit``). Handling them there, rather than in
the answer's task woken for each one through a queue and an async generator, saves the
event loop a task wake-up and a generator's resumption per streamed delta: with hundreds
of answers streaming, a good part of what it spends per delta. The answer's task waits on
``done``: resolved once the request finished, once the answer is stopped
(``Answer.stop_reason``), or with the engine's error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from conversations.chat.records import Answer

if TYPE_CHECKING:
    from inference import StreamDelta


class AnswerDeltas:
    """The sink of one answer's engine request (the loop's thread only)."""

    __slots__ = ("gen", "timing", "emit", "poke", "done", "request_finished")

    def __init__(
        self,
        gen: Answer,
        timing: dict[str, float],
        emit: Callable[[int, dict], None],
        poke: Callable[[], None],
    ) -> None:
        """``gen``: the answer's record; ``timing`` gets ``first_token``; ``emit(conversation
        id, event)`` fans an event out to the conversation's tabs; ``poke()`` tells the relay
        there is new text."""
        self.gen, self.timing, self.emit, self.poke = gen, timing, emit, poke
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The engine sent the request's last delta (or its failure): nothing to abort.
        self.request_finished = False

    def put_nowait(self, item: StreamDelta | BaseException) -> None:
        if self.done.done():  # stopped: what the engine still had in flight is dropped
            return
        if isinstance(item, BaseException):
            self.request_finished = True
            self.done.set_exception(item)
            return
        try:
            self._add(item)
        except Exception as exc:  # fails the answer, as an error in its task would
            self.done.set_exception(exc)

    def _add(self, delta: StreamDelta) -> None:
        gen = self.gen
        if "first_token" not in self.timing and (delta.token_ids or delta.text):
            self.timing["first_token"] = time.monotonic()
        gen.token_ids.extend(delta.token_ids or ())
        gen.cached_tokens = delta.num_cached_tokens or gen.cached_tokens
        reasoning = gen.reasoning.add(delta)
        if delta.text or reasoning:
            gen.text += delta.text
            self.poke()
            self.emit(
                gen.conversation_id,
                {
                    "type": "delta",
                    "conversation_id": gen.conversation_id,
                    "message_id": gen.message_id,
                    "text": delta.text,
                    **reasoning,
                },
            )
        if delta.finished:
            gen.finish_reason = delta.finish_reason
            self.request_finished = delta.request_finished
            self.done.set_result(None)
        elif gen.stop_reason:
            self.done.set_result(None)

    def close(self) -> None:
        """The answer's task stopped waiting (cancelled): later deltas are dropped."""
        if not self.done.done():
            self.done.cancel()
