"""Full garbage collections while the engine is idle, not in the middle of its streams.

The long-lived heap is frozen once the engine is loaded (``engine_handle``), but everything a
busy process creates afterwards ages into the oldest generation too: with a thousand streams
running, the requests' own objects. CPython then runs a full collection every few seconds,
walking all of them with every thread stopped: 200-500 ms pauses of every stream, and most of
the collector's time. The hot paths leave no reference cycles behind, so a full collection
rarely has anything to free there.

Here CPython's automatic full collections are off (the young generations still collect as
usual) and a small thread runs one itself when the engine has worked since the last one and
has had nothing running for a whole tick, or when ``max_interval_s`` has passed whatever the
load, so that a process that is never idle still frees its cyclic garbage now and then.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

from conversations.ops.engine_handle import loaded_engines

# CPython runs a full collection once this many younger ones ran (and enough objects aged).
FULL_COLLECTIONS_OFF = 2**31 - 1


class IdleCollector:
    """``activity()`` returns (a counter that grows while the engine works, whether anything
    is running or waiting now). ``tick`` decides once; ``start`` ticks every ``poll_s``."""

    def __init__(
        self,
        activity: Callable[[], tuple[int, bool]],
        *,
        max_interval_s: float,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        collect: Callable[[], object] = gc.collect,
    ) -> None:
        self.activity, self.max_interval_s, self.poll_s = activity, max_interval_s, poll_s
        self.clock, self.collect = clock, collect
        self.last_collection = clock()
        self.work_collected = self._work_at_last_tick = activity()[0]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thresholds: tuple[int, int, int] | None = None

    def tick(self) -> bool:
        """Collect if the engine has worked since the last collection and has been idle for a
        whole tick since (requests still arriving one by one are not interrupted), or if the
        longest interval has passed. Returns whether it collected."""
        work, busy = self.activity()
        quiet = not busy and work == self._work_at_last_tick
        self._work_at_last_tick = work
        due = quiet and work != self.work_collected
        if not due and self.clock() - self.last_collection < self.max_interval_s:
            return False
        self.collect()
        self.last_collection, self.work_collected = self.clock(), work
        return True

    def start(self) -> None:
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, FULL_COLLECTIONS_OFF)
        self._thread = threading.Thread(target=self._run, name="idle-collector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and give CPython its own full collections back."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.tick()


def engine_activity() -> tuple[int, bool]:
    """The site engines' steps so far, and whether any has requests running or queued."""
    steps, busy = 0, False
    for engine in loaded_engines():
        stats = engine.stats()
        steps += stats.num_steps
        busy = busy or bool(stats.running or stats.waiting or stats.loading)
    return steps, busy


_collector: IdleCollector | None = None


def start_idle_collector(max_interval_s: float) -> IdleCollector:
    """The server process's collector (started once), watching the site's engine."""
    global _collector
    if _collector is None:
        _collector = IdleCollector(engine_activity, max_interval_s=max_interval_s)
        _collector.start()
    return _collector
