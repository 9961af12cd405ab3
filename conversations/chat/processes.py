"""The chat's reads of the process registry (``conversations.cluster.registry``), which
never fail a tab: should Redis fail, this process alone serves it."""

from __future__ import annotations

import logging

from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID

log = logging.getLogger(__name__)


async def live_processes() -> dict[str, cluster.ProcessInfo]:
    """The live processes; should Redis fail, this one alone (it can still serve the tab)."""
    try:
        return await cluster.live_processes()
    except Exception:
        log.warning("cannot read the process registry", exc_info=True)
        return {PROCESS_ID: cluster.ProcessInfo(PROCESS_ID, ready=True)}


async def liveness_of(processes: dict[str, cluster.ProcessInfo]) -> cluster.Liveness:
    """Which processes are alive or dead; should Redis fail, ``processes`` and this one."""
    try:
        return await cluster.liveness()
    except Exception:
        log.warning("cannot read the process registry", exc_info=True)
        return cluster.Liveness(set(processes) | {PROCESS_ID}, known=set())
