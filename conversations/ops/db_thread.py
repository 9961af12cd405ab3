"""Lasting database connections for the threads that run many requests' database calls.

Under ASGI ``CONN_MAX_AGE`` is 0: Django's HTTP views run each request's sync code in a
thread of its own, and a connection kept there would outlive its thread. The chat's calls
(``db_call`` and ``database_sync_to_async`` from consumers and answers) all run in one
thread instead, the process-wide ``SyncToAsync.single_thread_executor``, and the JSON API's
in a few long-lived worker threads (``keep_connections`` is their initializer); opening a
connection per call is most of their cost. These threads keep their connection for
``DB_THREAD_CONN_MAX_AGE`` seconds (then open a new one); Django still drops it at once
after an error that left it unusable, or when a call left autocommit off. Every other thread
is unchanged.

**The hop.** Channels' ``database_sync_to_async`` runs a function on asgiref's thread for
thread-sensitive code (one thread, so SQLite's and the transactions' per-thread connections
hold), closing stale connections before and after. Around that, asgiref's ``SyncToAsync``
shields the call, copies every context variable into the thread and back out, and records
the caller's task. Measured on this project's machines with thousands of calls in flight
(hundreds of chat answers starting or ending at once), that is about 200 µs of CPU per call
across the two threads, against 100-130 µs for the same hop made plainly (one call at a
time, the threads' wake-ups dominate: about 170 µs either way). A chat answer makes two or
three such calls (its rows, its question's token segment where the prompt has one, its final
save).

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
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import AsyncToSync, SyncToAsync
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

_lasting = threading.local()


def keep_connections() -> None:
    """Mark this thread as one whose connections last (a worker thread's initializer)."""
    _lasting.on = True


def in_db_thread() -> bool:
    """Whether this is the single-thread executor's thread (read, never started, here: a
    thread started at import would be missing in a forked child)."""
    return threading.current_thread() in getattr(SyncToAsync.single_thread_executor, "_threads", ())


def connections_last() -> bool:
    """Whether this thread's connections outlive each call."""
    return settings.DB_THREAD_CONN_MAX_AGE > 0 and (getattr(_lasting, "on", False) or in_db_thread())


_lasting_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: in those threads, the connection lasts."""
    if connection.settings_dict["CONN_MAX_AGE"] == 0 and connections_last():
        connection.close_at = time.monotonic() + settings.DB_THREAD_CONN_MAX_AGE
        _lasting_connections.add(connection)


def close_thread_connections() -> None:
    """Close those threads' connections, from any thread, while none of them runs a call
    (e.g. before a test database is dropped)."""
    for connection in list(_lasting_connections):
        connection.inc_thread_sharing()  # closed from this thread, not its own
        try:
            connection.close()
        finally:
            connection.dec_thread_sharing()
    _lasting_connections.clear()


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
