"""Handing a new answer to the process that should generate it, acknowledged.

The tab's process creates the answer's row with its chosen owner and sends that process
``chat.generate`` (:func:`forward`). Before it starts, the owner *claims* the answer:
``SET {prefix}:claim:{message_id} <pid> NX`` in Redis (:func:`claim`), which is its
acknowledgement. The tab's process waits ``CLUSTER_ACK_SECONDS`` for the claim, then tries
to claim the answer itself. Redis orders the two claims, so exactly one process generates
the answer, however late a message arrives:

- the owner's claim came first: it generates the answer (an acknowledgement that came
  late changes nothing);
- the tab's process won (the message was lost, or the owner is stalled or gone): it takes
  the row over (only if the owner still owns it, streaming) and generates the answer
  itself, or, when its engine cannot, stores it as an error and sends the tab ``error``
  (with ``message_id``) and every tab the ``finished`` error. A ``chat.generate`` that
  reaches the owner afterwards finds the claim taken and is dropped.

Whatever is left (Redis failed in between, the tab's process died before its deadline), the
owner's own sweep finds: a ``streaming`` row it owns that no generation here runs
(``conversations.cluster.fencing``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from conversations.chat import lifecycle
from conversations.chat.answer_rows import take_over
from conversations.chat.groups import broadcast, conversation_group
from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID
from conversations.ops.engine_handle import engine_status

if TYPE_CHECKING:
    from conversations.chat.answers import GenerationManager

log = logging.getLogger(__name__)

# A claim outlives any message in flight (the channel layer expires messages after 60 s).
CLAIM_TTL_SECONDS = 300
# Group events of an answer settled here on behalf of its owner carry this as the process,
# so every tab (this process's too) treats them as news from elsewhere.
TAKEN_BACK = "handoff"
UNAVAILABLE = "No server process could take this answer; please try again."


@dataclass
class Handoff:
    """What ``chat.generate`` carries: the answer and whose it is."""

    conversation_id: int
    owner_id: int  # the user
    message_id: int


def _claim_key(message_id: int) -> str:
    return f"{settings.CLUSTER_PREFIX}:claim:{message_id}"


async def claim(message_id: int) -> bool:
    """Whether this process is the one to generate the answer (the first to claim it)."""
    key = _claim_key(message_id)
    return bool(await cluster.redis_client().set(key, PROCESS_ID, nx=True, ex=CLAIM_TTL_SECONDS))


async def claimed(message_id: int) -> bool:
    return bool(await cluster.redis_client().exists(_claim_key(message_id)))


async def forward(
    manager: GenerationManager,
    owner: str,
    processes: dict[str, cluster.ProcessInfo],
    handoff: Handoff,
    notify: Callable[[dict], None],
) -> bool:
    """Send the answer to ``owner`` (its row names it) and see it claimed within
    ``CLUSTER_ACK_SECONDS``, in the background. False if it could not even be sent: then
    it is taken back at once. ``notify`` gets the tab's ``error`` should it fail here."""
    message = {"type": "chat.generate", **asdict(handoff)}
    if owner in processes and await cluster.send_to_process(processes[owner], message):
        _keep(manager, _await_claim(manager, owner, handoff, notify))
        return True
    try:
        won = await claim(handoff.message_id)
    except Exception:  # Redis is down: the owner could neither get the message nor claim it
        log.warning("cannot claim answer %s; generating it here", handoff.message_id, exc_info=True)
        won = True
    if won:
        await _take_back(manager, owner, handoff, notify)
    return False


def _keep(manager: GenerationManager, coroutine) -> None:
    task = manager.loop.create_task(coroutine)
    manager.background.add(task)  # held until done: the loop keeps only weak references
    task.add_done_callback(manager.background.discard)


async def _await_claim(
    manager: GenerationManager, owner: str, handoff: Handoff, notify: Callable[[dict], None]
) -> None:
    deadline = time.monotonic() + settings.CLUSTER_ACK_SECONDS
    pause = 0.02
    try:
        while time.monotonic() < deadline:
            if await claimed(handoff.message_id):
                return
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 0.25)
        if not await claim(handoff.message_id):
            return  # the owner claimed it just now
        log.warning(
            "process %s did not claim answer %s within %.1f s: taking it back",
            owner,
            handoff.message_id,
            settings.CLUSTER_ACK_SECONDS,
        )
        await _take_back(manager, owner, handoff, notify)
    except Exception:
        # Redis failed: the owner cannot claim either; its sweep settles the row.
        log.warning("the hand-off of answer %s failed", handoff.message_id, exc_info=True)


async def _take_back(
    manager: GenerationManager, owner: str, handoff: Handoff, notify: Callable[[dict], None]
) -> None:
    """This process won the claim: generate the answer here if the row is still the
    owner's, or store it as an error if this process cannot generate."""
    if not await take_over(handoff.message_id, owner):
        return  # stopped, deleted or failed over meanwhile
    if engine_status()["state"] != "error":
        manager.start_answer(**asdict(handoff))
        return
    message = await lifecycle.fail_unavailable(handoff.message_id, UNAVAILABLE)
    notify({"type": "error", "detail": UNAVAILABLE, "code": "server_error", "message_id": handoff.message_id})
    if message is not None:
        group = conversation_group(handoff.conversation_id)
        await broadcast(group, "finished", message_id=handoff.message_id, message=message, process=TAKEN_BACK)
