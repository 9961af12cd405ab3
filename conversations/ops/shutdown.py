"""A site process's shutdown (SIGTERM, SIGINT), bounded in time.

How Daphne stops: it runs Twisted's asyncio reactor, which turns the signal into
``reactor.stop()``. The "before shutdown" triggers run first, on the event loop, which still
runs: Daphne's own cancels the open connections' application instances, and ours runs
:func:`shut_down` (registered by ``chatsite.asgi``); the shutdown waits for the Deferred a
trigger returns. Then the listeners close, the loop stops for good and the interpreter exits,
joining every non-daemon thread first: the workers of the loop's default executor and of
asgiref's executors (``concurrent.futures.thread._python_exit``). A worker waiting on the
stopped loop, or busy with a long job, would hold the process for ever, and the engine's
daemon thread would be killed in the middle of a step.

So :func:`shut_down`

1. marks the process stopping (no title or data job starts any more) and arms a watchdog
   that ends the process ``budget`` seconds after the signal, whatever still runs;
2. at once: aborts the live answers, each saved ``interrupted`` with its text so far;
   cancels the title jobs; cuts the data jobs short, each recorded failed;
3. stops the engine's thread (an API stream still open ends), sees the HTTP requests in
   progress to their end (a cut data job's request among them), then, with several
   processes, leaves the process registry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from conversations.chat.manager import current_manager, stop_live_answers
from conversations.chat.titles import cancel_title_work
from conversations.cluster import registry as cluster
from conversations.ops import stopping
from conversations.ops.engine_handle import stop_engine
from conversations.transfer.jobs import stop_running_jobs

log = logging.getLogger(__name__)

# Shares of the budget: the work of step 2 (in parallel), the engine, the requests. What is
# left covers the registry, the closing of the sockets and the interpreter's exit.
WORK_SHARE = 0.4
ENGINE_SHARE = 0.1
REQUESTS_SHARE = 0.2
REGISTRY_SECONDS = 1.0


@dataclass(frozen=True)
class ShutdownReport:
    answers: int
    titles: int
    jobs: int
    requests: int


async def shut_down(
    budget: float, requests: Callable[[], Collection[asyncio.Task]] = tuple
) -> ShutdownReport:
    """Run on the event loop, which must keep running until this returns. ``requests``: the
    tasks of the HTTP requests in progress (each must see the loop until it ends)."""
    started = time.monotonic()
    stopping.begin()
    stopping.arm_watchdog(budget)
    work = budget * WORK_SHARE
    answers, titles, jobs = await asyncio.gather(
        _bounded(stop_live_answers(work), "stop the live answers"),
        _bounded(cancel_title_work(work), "cancel the title jobs"),
        _bounded(stopping.in_own_thread(stop_running_jobs, work, timeout=work + 0.5), "stop the data jobs"),
    )
    engine = budget * ENGINE_SHARE
    await _bounded(stopping.in_own_thread(stop_engine, engine, timeout=engine + 0.5), "stop the engine")
    finished = await _bounded(_finish_requests(requests(), budget * REQUESTS_SHARE), "finish the requests")
    if cluster.enabled():
        await _bounded(asyncio.wait_for(_leave_cluster(), REGISTRY_SECONDS), "leave the registry")
    outcome = ShutdownReport(answers or 0, titles or 0, jobs or 0, finished or 0)
    log.info(
        "shutdown: %d answers interrupted, %d title jobs cancelled, %d data jobs stopped, "
        "%d requests finished in %.1f s",
        outcome.answers,
        outcome.titles,
        outcome.jobs,
        outcome.requests,
        time.monotonic() - started,
    )
    return outcome


async def _bounded(step: Awaitable, what: str):
    """``step``'s result, or None when it failed or ran out of time (the others go on)."""
    try:
        return await step
    except Exception:
        log.warning("shutdown: could not %s", what, exc_info=True)
        return None


async def _finish_requests(tasks: Collection[asyncio.Task], timeout: float) -> int:
    """Wait for the requests in progress; cancel those still going after ``timeout`` (a
    thread of theirs may then be left waiting: the watchdog sees to it)."""
    pending = [task for task in tasks if not task.done()]
    if not pending:
        return 0
    done, left = await asyncio.wait(pending, timeout=timeout)
    for task in left:
        task.cancel()
    return len(done)


async def _leave_cluster() -> None:
    """No more advertising (nor answers routed here), and out of the registry at once rather
    than when the entry expires."""
    manager = current_manager()
    tasks = manager.process_tasks if manager is not None else []
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    await cluster.withdraw(cluster.PROCESS_ID)
