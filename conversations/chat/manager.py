"""The :class:`~conversations.chat.answers.GenerationManager` of each event loop (one per
process under Daphne), created with the process loop that serves it when several processes
serve the site (``conversations.cluster.process_loop``), and its answers stopped when the
process shuts down."""

from __future__ import annotations

import asyncio
import time
import weakref

from django.conf import settings

from conversations.chat import lifecycle
from conversations.chat.answers import GenerationManager
from conversations.chat.records import LiveNode, StopReason
from conversations.cluster import registry as cluster
from conversations.cluster.process_loop import start_process_loop
from conversations.ops.stopping import in_own_thread

_managers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GenerationManager] = (
    weakref.WeakKeyDictionary()
)


def get_manager() -> GenerationManager:
    """The manager of the running event loop, created on first use."""
    loop = asyncio.get_running_loop()
    manager = _managers.get(loop)
    if manager is None:
        manager = _managers[loop] = GenerationManager(loop)
        if cluster.enabled() and settings.CLUSTER_ADVERTISE:
            start_process_loop(manager)
    return manager


def current_manager() -> GenerationManager | None:
    """The running loop's manager if it has one (none is created)."""
    return _managers.get(asyncio.get_running_loop())


async def stop_live_answers(timeout: float) -> int:
    """At shutdown: abort the running loop's live answers and have each saved
    ``interrupted`` with its text so far, within ``timeout`` seconds. Returns how many.

    Each answer's own task saves it once its engine request ends. Should that not happen in
    time (its save queued in asgiref's shared thread behind a long request, say), the text so
    far is written from a thread of its own; so are the ``streaming`` rows of this process
    that no generation here runs (an answer created as the signal came)."""
    manager = current_manager()
    live = list(manager.generations.values()) if manager is not None else []
    for gen in live:
        manager.stop(gen.message_id, StopReason.SHUTDOWN)
    tasks = [gen.task for gen in live if gen.task is not None]
    started = time.monotonic()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout / 2)
    unsaved = [_interrupted_fields(gen) for gen in live if gen.message_id in manager.generations]
    left = max(0.5, timeout - (time.monotonic() - started))
    await in_own_thread(lifecycle.interrupt_at_shutdown, unsaved, timeout=left)
    return len(live)


def _interrupted_fields(gen: LiveNode) -> tuple[int, dict[str, object]]:
    return gen.message_id, {
        "content": gen.text,
        **gen.reasoning.message_fields(),
        "token_ids": list(gen.token_ids) or None,
        "completion_tokens": len(gen.token_ids),
    }
