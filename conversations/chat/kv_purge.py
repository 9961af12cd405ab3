"""A user's KV blocks leave every engine when their data goes.

A deleted user (``post_delete`` on the user model) and a user whose deleted conversations
housekeeping purged both call :func:`purge_user_kv` for that user's prefix-cache namespace
(``conversations.chat.cache_salt``). After the deletion commits, this process's engine
drops the namespace's blocks from every tier (``AsyncEngine.purge_namespace``), and with
several processes every other live process in the registry gets ``{"type": "kv.purge",
"namespace"}`` on its channel and does the same (``conversations.cluster.process_loop``).

A process that is not in the registry when the purge is sent (down, or not yet serving
chat) misses it: its memory tiers are empty after a restart anyway, but its disk tier
keeps that namespace's files until they age out of its size bound. Nobody else can reach
them (every other user's salt differs); a later purge of the same user deletes them.
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from django.db import transaction

from conversations.chat.cache_salt import user_namespace
from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID
from conversations.ops.engine_handle import loaded_engines

log = logging.getLogger(__name__)

PURGE_MESSAGE = "kv.purge"
_tasks: set[asyncio.Task] = set()


def purge_user_kv(user_id: int) -> None:
    """Drop user ``user_id``'s KV blocks everywhere once the current transaction commits
    (at once outside one); never raises: the deletion itself has happened."""
    namespace = user_namespace(user_id)
    transaction.on_commit(lambda: purge_namespace_everywhere(namespace))


def purge_namespace_everywhere(namespace: str) -> None:
    for engine in loaded_engines():  # every served model's
        engine.purge_namespace(namespace)
    if not cluster.enabled():
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is None:
            async_to_sync(tell_other_processes)(namespace)
        else:  # called on an event loop (an async view): send from a task of it
            task = loop.create_task(tell_other_processes(namespace))
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
    except Exception:
        log.warning("could not send the KV purge of %s to the other processes", namespace, exc_info=True)


async def tell_other_processes(namespace: str) -> int:
    """``kv.purge`` to every live process but this one; returns how many were sent."""
    sent = 0
    for pid, info in (await cluster.live_processes()).items():
        if pid != PROCESS_ID and await cluster.send_to_process(
            info, {"type": PURGE_MESSAGE, "namespace": namespace}
        ):
            sent += 1
    return sent


def apply_purge_message(message: dict) -> None:
    """A ``kv.purge`` from another process: drop the namespace from this process's engine."""
    namespace = message.get("namespace")
    if isinstance(namespace, str) and namespace:
        for engine in loaded_engines():
            engine.purge_namespace(namespace)


def user_deleted(sender: type, instance: object, **kwargs: object) -> None:
    """``post_delete`` receiver for the user model."""
    purge_user_kv(instance.pk)  # type: ignore[attr-defined]
