"""ORM calls from async code, on the database thread, with less around each call.

Channels' ``database_sync_to_async`` runs a function on asgiref's thread for thread-sensitive
code (one thread, so SQLite's and the transactions' per-thread connections hold), closing
stale connections before and after. Around that, asgiref's ``SyncToAsync`` shields the call,
copies every context variable into the thread and back out, and records the caller's task.
Measured on this project's machines with thousands of calls in flight (hundreds of chat
answers starting or ending at once), that is about 200 µs of CPU per call across the two
threads, against 100-130 µs for the same hop made plainly (one call at a time, the threads'
wake-ups dominate: about 170 µs either way). A chat answer makes three such calls (its rows,
its question's token segment, its final save).

``db_call`` makes the same hop plainly where asgiref would pick its single database thread
(an event loop not started by ``async_to_sync``, outside a ``ThreadSensitiveContext``): the
same thread, the same stale-connection checks, the caller's context variables visible (a
copy: the function's changes to them stay in the thread, as none of its callers read them
back). Anywhere else it is ``database_sync_to_async``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import AsyncToSync, SyncToAsync
from channels.db import database_sync_to_async
from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")


def db_call(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``database_sync_to_async(func)``, with a plainer hop where that is the same thread."""
    fallback = database_sync_to_async(func)

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        executor = _database_thread(loop)
        if executor is None:
            return await fallback(*args, **kwargs)
        context = contextvars.copy_context()
        return await loop.run_in_executor(executor, _run, context, func, args, kwargs)

    call.func = func  # type: ignore[attr-defined]  # as database_sync_to_async's, for tests
    return call


def _database_thread(loop: asyncio.AbstractEventLoop) -> Any:
    """asgiref's executor for thread-sensitive code where it is its single database thread;
    None where asgiref would choose another (a sync caller's thread, a context's own)."""
    if getattr(AsyncToSync.executors, "current", None) is not None:
        return None
    if SyncToAsync.thread_sensitive_context.get(None) is not None:
        return None
    if loop in AsyncToSync.loop_thread_executors:
        return None
    return SyncToAsync.single_thread_executor


def _run(context: contextvars.Context, func: Callable[..., R], args: tuple, kwargs: dict) -> R:
    close_old_connections()
    try:
        return context.run(func, *args, **kwargs)
    finally:
        close_old_connections()
