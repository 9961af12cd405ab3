"""The channel-layer groups of the chat: one per conversation, one per user.

Coarse events (an answer started or finished, the tree changed, a title was set) and
the owner's relay of live text go to a group, reaching every tab in every process.
"""

from __future__ import annotations

import logging

from channels.layers import get_channel_layer

from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID

log = logging.getLogger(__name__)


def conversation_group(conversation_id: int) -> str:
    return f"chat.conversation.{conversation_id}"


def user_group(user_id: int) -> str:
    return f"chat.user.{user_id}"


# Events about an answer of the sending process: that process's tabs get them from its
# generation manager (and ignore these), so only other processes' tabs need them.
OWN_ANSWER_EVENTS = frozenset({"started", "progress", "finished", "delta", "snapshot", "heartbeat"})


async def broadcast(group: str, event: str, **data: object) -> None:
    """A coarse event to every consumer in ``group`` (in any process)."""
    layer = get_channel_layer()
    if layer is None:
        return
    if event in OWN_ANSWER_EVENTS and data.get("process", PROCESS_ID) == PROCESS_ID and not cluster.enabled():
        return  # one process: nobody would read it
    try:
        await layer.group_send(group, {"type": "chat.event", "event": event, "process": PROCESS_ID, **data})
    except Exception:  # a full or unreachable layer must not break a generation
        log.warning("group_send to %s failed", group, exc_info=True)


async def announce_finished(messages: list[dict], process: str) -> None:
    """Tell each message's conversation that it is finished as stored (``message``), on
    behalf of ``process``: a process id, or a stand-in such as the fail-over's."""
    for message in messages:
        await broadcast(
            conversation_group(message["conversation_id"]),
            "finished",
            message_id=message["id"],
            message=message,
            process=process,
        )
