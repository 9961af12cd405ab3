"""The process-wide facts of a shutdown in progress, for the modules that must not start
work the process would not live to finish (titles, data jobs); ``conversations.ops.shutdown``
runs the shutdown itself.

Also its two tools: a call in a fresh daemon thread that the event loop can stop waiting
for, and the watchdog that ends the process when a thread will not let go.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connections

log = logging.getLogger(__name__)

T = TypeVar("T")

_stopping = threading.Event()


def begin() -> None:
    _stopping.set()


def is_stopping() -> bool:
    return _stopping.is_set()


async def in_own_thread(func: Callable[..., T], *args: object, timeout: float) -> T:
    """``func(*args)`` in a new daemon thread, waited for at most ``timeout`` seconds
    (``TimeoutError``). Neither the loop's executor nor asgiref's shared thread: either may
    be busy with the very work being stopped, and at exit the interpreter joins their
    threads, whereas one left behind here cannot hold the process."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(func(*args))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            connections.close_all()  # this thread's own

    threading.Thread(target=run, name=f"stopping-{func.__name__}", daemon=True).start()
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout)


def arm_watchdog(seconds: float, exit_status: int = 1) -> threading.Thread:
    """End the process ``seconds`` from now should it still be there: a thread that never
    returns (a job in a C call, a wait on a loop that has stopped) would otherwise keep the
    interpreter joining it at exit for ever."""

    def watch() -> None:
        time.sleep(seconds)
        busy = sorted(t.name for t in threading.enumerate() if t.is_alive() and not t.daemon)
        log.error("shutdown: still running %g s after the signal (threads: %s); forcing exit", seconds, busy)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # where each one hangs
        sys.stderr.flush()
        os._exit(exit_status)

    thread = threading.Thread(target=watch, name="shutdown-watchdog", daemon=True)
    thread.start()
    return thread
