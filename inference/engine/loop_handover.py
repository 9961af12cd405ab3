"""Handing the engine thread's deltas to the event loops that stream them, and knowing
whether those loops have worked through what they were handed.

One ``call_soon_threadsafe`` per loop per step carries every item for that loop. A loop is
*behind* from that call until the tasks the items wake (and the tasks those wake) have run;
the engine thread asks ``wait`` before its next step, so tokens a busy loop cannot write yet
do not age in its queue while the engine takes the GIL to make more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from inference.engine.outputs import StreamDelta

logger = logging.getLogger(__name__)


class DeltaSink(Protocol):
    """Where a request's deltas go: a ``Mailbox`` (``stream``), or a caller's own object."""

    def put_nowait(self, item: StreamDelta | BaseException) -> None: ...


Outbox = dict[asyncio.AbstractEventLoop, list[tuple[DeltaSink, Any]]]


class LoopHandover:
    def __init__(self) -> None:
        # Per event loop, the hand-overs it has not worked through yet (under _cond).
        self._behind: dict[asyncio.AbstractEventLoop, int] = {}
        self._cond = threading.Condition()
        self._behind_since = 0.0  # when the loops last fell behind
        self._stopped = False

    def stop(self) -> None:
        """Wake a ``wait`` in progress; later ones return at once."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def deliver(self, outbox: Outbox, on_closed_loop: Callable[[list[tuple[DeltaSink, Any]]], None]) -> None:
        """Hand each loop its items; ``on_closed_loop(items)`` for a loop that is closed
        (nobody listens there any more)."""
        for loop, items in outbox.items():
            with self._cond:
                if not self._behind:
                    self._behind_since = time.monotonic()
                self._behind[loop] = self._behind.get(loop, 0) + 1
            try:
                loop.call_soon_threadsafe(self._put_all, loop, items)
            except RuntimeError:
                self._mark_caught_up(loop)
                on_closed_loop(items)

    def _put_all(self, loop: asyncio.AbstractEventLoop, items: list[tuple[DeltaSink, Any]]) -> None:
        """On the loop: hand each item to its sink; once the tasks they wake have run, and
        the tasks those wake in turn, the loop has caught up with this hand-over. The first
        call_soon runs after the first wave (scheduled before it), the second after the
        second wave. A sink that raises loses its item, not the others'."""
        for sink, item in items:
            try:
                sink.put_nowait(item)
            except Exception:
                logger.exception("a delta sink failed")
        loop.call_soon(loop.call_soon, self._mark_caught_up, loop)

    def _mark_caught_up(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._cond:
            left = self._behind.get(loop, 0) - 1
            if left > 0:
                self._behind[loop] = left
            else:
                self._behind.pop(loop, None)
                self._cond.notify()

    def wait(self, limit: float) -> bool:
        """Whether the loops have worked through every hand-over, waiting for that while
        they have been behind for less than ``limit`` seconds. Tokens a busy loop cannot
        write yet would only age in its queue: while it catches up the engine thread
        sleeps and leaves it the GIL, and requests arriving meanwhile join the next step's
        batch. A loop behind for longer (stalled, or gone without closing) is not waited
        for: the engine steps on, emitting every ``MAX_HOLD_INTERVALS`` intervals. A loop
        that is not running cannot catch up: it is forgotten (a closed one for good, as a
        loop closed between a hand-over and its last callback never marks it)."""
        with self._cond:
            deadline = self._behind_since + limit
            while self._behind and not self._stopped:
                for loop in [loop for loop in self._behind if not loop.is_running()]:
                    del self._behind[loop]
                if not self._behind:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
