"""A process's own check of its answers, run by its process loop every few seconds.

- **Fenced answers.** A live generation whose row this process no longer owns (another
  process failed it over while this one seemed dead, e.g. paused past the registry's
  expiry) is stopped at once: the engine aborts it, and nothing more is written or relayed
  (see the fence in ``conversations.chat.answer_rows``). The answer's own writes find this
  too; this check also catches an answer that writes nothing for a while (queued, or in a
  long prefill).
- **Unattended answers.** A ``streaming`` row this process owns but no generation here
  runs, untouched for ``UNATTENDED_SECONDS``: a forwarded answer whose ``chat.generate``
  never came and whose tab's process could not take it back (see
  ``conversations.cluster.handoff``). It becomes ``interrupted`` and the tabs are told, so
  no row stays ``streaming`` with nobody working on it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.chat.answer_rows import owned_answers
from conversations.chat.groups import announce_finished
from conversations.chat.tree import message_dict
from conversations.cluster.registry import PROCESS_ID
from conversations.models import Message

if TYPE_CHECKING:
    from conversations.chat.answers import GenerationManager

log = logging.getLogger(__name__)

# Group events of answers settled by this check carry this as the process, so every tab
# (this process's too) takes them as news.
SWEEPER = "sweep"


def unattended_seconds() -> float:
    """Well past any hand-off: the tab's process takes an unclaimed answer back after
    ``CLUSTER_ACK_SECONDS``."""
    return max(15.0, 5 * settings.CLUSTER_ACK_SECONDS)


async def fence(manager: GenerationManager) -> int:
    """Stop the live generations whose rows are no longer this process's; how many."""
    live = [gen for gen in manager.generations.values() if not gen.done.is_set()]
    if not live:
        return 0
    owned = await owned_answers([gen.message_id for gen in live])
    lost = [gen for gen in live if gen.message_id not in owned and not gen.done.is_set()]
    for gen in lost:
        log.warning("answer %s is no longer this process's (failed over?): stopping it", gen.message_id)
        manager.stop(gen.message_id, "fenced")
    return len(lost)


@database_sync_to_async
def _interrupt_unattended(live_ids: list[int]) -> list[dict]:
    cutoff = timezone.now() - timedelta(seconds=unattended_seconds())
    with transaction.atomic():
        rows = list(
            Message.objects.select_for_update(skip_locked=True)
            .filter(status=Message.Status.STREAMING, owner_process=PROCESS_ID, updated_at__lt=cutoff)
            .exclude(pk__in=live_ids)
            .defer("token_ids")
        )
        if not rows:
            return []
        Message.objects.filter(pk__in=[m.pk for m in rows]).update(
            status=Message.Status.INTERRUPTED, finish_reason="abort", updated_at=timezone.now()
        )
    for m in rows:
        m.status, m.finish_reason = Message.Status.INTERRUPTED, "abort"
    return [{**message_dict(m), "conversation_id": m.conversation_id} for m in rows]


async def sweep_unattended(manager: GenerationManager) -> int:
    """Interrupt this process's ``streaming`` rows that nothing here generates; how many."""
    swept = await _interrupt_unattended(list(manager.generations))
    for message in swept:
        log.warning("answer %s was never started here: now interrupted", message["id"])
    await announce_finished(swept, SWEEPER)
    return len(swept)
