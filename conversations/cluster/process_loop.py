"""What each process does in the background when several serve the site (REDIS_URL set).

Started once per event loop with its :class:`~conversations.chat.answers.GenerationManager`
(by ``conversations.chat.manager``):

- **Advertise** every ``ADVERTISE_SECONDS``: alive, engine ready, load (running, waiting,
  free KV, live answers) and the channel this process listens on; also which
  conversations its tabs show.
- **Listen** on that channel (on a channel layer instance of its own:
  ``registry.process_layer``): ``chat.generate`` (an answer whose row another process
  created with this process as its owner; generated here once claimed, see
  ``conversations.cluster.handoff``), ``chat.stop``, ``chat.snapshot`` (send a tab
  elsewhere the text and reasoning so far of an answer generated here), ``chat.retain`` /
  ``chat.release`` (keep the KV of a conversation a tab elsewhere shows, whose answers were
  generated here: ``conversations.chat.retention``), ``kv.purge`` (drop a user's KV blocks:
  ``conversations.chat.kv_purge``).
- **Fail over** every ``REAP_SECONDS``: ``streaming`` answers owned by a process whose
  registry entry expired become ``interrupted`` with the text saved so far, and their
  conversations' tabs are told (see :func:`fail_over`); the KV retention marks
  made here for a process that died are released.
- **Fence**: stop the answers whose rows are no longer this process's (failed over while
  it seemed dead); interrupt the rows it owns that nothing here generates
  (``conversations.cluster.fencing``).
- **Grace**: re-check, for answers with no tab here, whether a tab elsewhere shows them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from channels.layers import get_channel_layer

from conversations.chat import lifecycle
from conversations.chat.groups import announce_finished
from conversations.chat.kv_purge import PURGE_MESSAGE, apply_purge_message
from conversations.chat.retention import get_retention
from conversations.cluster import registry as cluster
from conversations.cluster.fencing import fence, sweep_unattended
from conversations.cluster.handoff import claim
from conversations.cluster.registry import PROCESS_ID, ProcessInfo
from conversations.ops.engine_handle import current_engine

if TYPE_CHECKING:
    from conversations.chat.answers import GenerationManager

log = logging.getLogger(__name__)

REAP_SECONDS = 3.0
# Group events of a failed-over answer carry this instead of a process id: every tab
# (the reaping process's too) treats them as news from elsewhere.
REAPER = "failover"


def start_process_loop(manager: GenerationManager) -> None:
    manager.process_tasks = [
        manager.loop.create_task(_listen(manager), name="cluster-listen"),
    ]


def _raise_if_cancelled() -> None:
    """Redis clients can turn a cancellation into a connection error: never retry then, or
    the loop (a test's, or a server's at shutdown) would wait forever for this task."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _info(manager: GenerationManager, channel: str) -> ProcessInfo:
    info = ProcessInfo(PROCESS_ID, channel=channel, live=len(manager.generations))
    engine = current_engine()
    if engine is not None:
        stats = engine.stats()
        info.ready = True
        info.running, info.waiting = stats.running, stats.waiting
        info.free_kv = stats.kv_blocks_free + stats.kv_blocks_cached
    return info


async def _listen(manager: GenerationManager) -> None:
    # Its own layer instance: this loop is the only receiver there, and it is never
    # cancelled while the process serves, so no consumer's disconnect can drop its messages.
    layer = cluster.process_layer()
    channel = await layer.new_channel()
    # Keep a reference: the loop holds tasks only weakly, and one nobody holds can vanish.
    manager.process_tasks.append(
        manager.loop.create_task(_housekeeping(manager, channel), name="cluster-housekeeping")
    )
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception:
            _raise_if_cancelled()
            log.warning("receiving on the process channel failed", exc_info=True)
            await asyncio.sleep(1.0)
            continue
        try:
            await _handle(manager, message)
        except Exception:
            log.exception("process message %s failed", message.get("type"))


async def _handle(manager: GenerationManager, message: dict) -> None:
    kind = message.get("type")
    if kind == "chat.generate":
        if not await claim(message["message_id"]):  # taken back by the tab's process meanwhile
            log.warning(
                "answer %s was claimed elsewhere before it reached this process", message["message_id"]
            )
            return
        manager.start_answer(
            conversation_id=message["conversation_id"],
            owner_id=message["owner_id"],
            message_id=message["message_id"],
        )
    elif kind == "chat.stop":
        manager.stop(message["message_id"], message.get("reason") or "user")
    elif kind == "chat.approve":  # a tool call of this process's waiting for the user
        manager.decide(message["message_id"], bool(message.get("approved")))
    elif kind == "chat.retain":
        get_retention().retain_for(message["conversation_id"], message["origin"])
    elif kind == "chat.release":
        get_retention().release_for(message["conversation_id"], message["origin"])
    elif kind == PURGE_MESSAGE:
        apply_purge_message(message)
    elif kind == "chat.snapshot":
        text = manager.live_text(message["message_id"])
        if text is not None:
            await get_channel_layer().send(
                message["reply"],
                {
                    "type": "chat.event",
                    "event": "snapshot",
                    "process": PROCESS_ID,
                    "message_id": message["message_id"],
                    "offset": 0,
                    "text": text,
                    "reasoning_offset": 0,
                    "reasoning": manager.live_reasoning(message["message_id"]) or "",
                },
            )


async def _housekeeping(manager: GenerationManager, channel: str) -> None:
    last_reap = 0.0
    advertised = False
    while True:
        try:
            if not await cluster.advertise(_info(manager, channel)) and advertised:
                log.warning("this process's registry entry had expired: others may take it for dead")
            advertised = True
            await cluster.set_watching(list(manager.watchers))
            for gen in list(manager.generations.values()):
                if not manager.watcher_count(gen.conversation_id):
                    manager.check_grace(gen)
            await fence(manager)
            if time.monotonic() - last_reap >= REAP_SECONDS:
                last_reap = time.monotonic()
                liveness = await cluster.liveness()
                await fail_over(liveness)
                await sweep_unattended(manager)
                get_retention().forget_processes(liveness.live)
        except asyncio.CancelledError:
            raise
        except Exception:
            _raise_if_cancelled()
            log.warning("cluster housekeeping failed", exc_info=True)
        await asyncio.sleep(cluster.ADVERTISE_SECONDS)


async def fail_over(liveness: cluster.Liveness, message_ids: list[int] | None = None) -> int:
    """Interrupt the answers of dead processes and tell their conversations' tabs."""
    reaped = await lifecycle.interrupt_dead_owners(liveness, message_ids)
    for message in reaped:
        log.warning("answer %s of a dead process is now interrupted", message["id"])
    await announce_finished(reaped, REAPER)
    return len(reaped)
