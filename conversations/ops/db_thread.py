"""Lasting database connections for the threads that run many requests' database calls.

Under ASGI ``CONN_MAX_AGE`` is 0: Django's HTTP views run each request's sync code in a
thread of its own, and a connection kept there would outlive its thread. The chat's calls
(``database_sync_to_async`` from consumers and answers) all run in one thread instead, the
process-wide ``SyncToAsync.single_thread_executor``, and the JSON API's in a few long-lived
worker threads (``keep_connections`` is their initializer); opening a connection per call
is most of their cost. These threads keep their connection for ``DB_THREAD_CONN_MAX_AGE``
seconds (then open a new one); Django still drops it at once after an error that left it
unusable, or when a call left autocommit off. Every other thread is unchanged.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from asgiref.sync import SyncToAsync
from django.conf import settings

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
