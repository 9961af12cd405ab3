"""The :class:`~conversations.chat.answers.GenerationManager` of each event loop (one per
process under Daphne), created with the process loop that serves it when several processes
serve the site (``conversations.cluster.process_loop``)."""

from __future__ import annotations

import asyncio
import weakref

from django.conf import settings

from conversations.chat.answers import GenerationManager
from conversations.cluster import registry as cluster
from conversations.cluster.process_loop import start_process_loop

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
