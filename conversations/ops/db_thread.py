"""A lasting database connection for the thread that runs the websocket's database calls.

Under ASGI ``CONN_MAX_AGE`` is 0: Django's HTTP views run each request's sync code in a
thread of its own, and a connection kept there would outlive its thread. The chat's calls
(``database_sync_to_async`` from consumers and answers) all run in one thread instead, the
process-wide ``SyncToAsync.single_thread_executor``, and opening a connection per call is
most of their cost. That one thread keeps its connection for ``DB_THREAD_CONN_MAX_AGE``
seconds (then opens a new one); Django still drops it at once after an error that left it
unusable, or when a call left autocommit off. Every other thread is unchanged.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from asgiref.sync import SyncToAsync
from django.conf import settings


def in_db_thread() -> bool:
    """Whether this is the single-thread executor's thread (read, never started, here: a
    thread started at import would be missing in a forked child)."""
    return threading.current_thread() in getattr(SyncToAsync.single_thread_executor, "_threads", ())


def on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: in that thread, the connection lasts."""
    age = settings.DB_THREAD_CONN_MAX_AGE
    if age > 0 and connection.settings_dict["CONN_MAX_AGE"] == 0 and in_db_thread():
        connection.close_at = time.monotonic() + age


def close_thread_connections() -> None:
    """Close that thread's connections (from any thread; e.g. before a test database is dropped)."""
    from django.db import connections

    if getattr(SyncToAsync.single_thread_executor, "_threads", ()):
        SyncToAsync.single_thread_executor.submit(connections.close_all).result()
