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
  ``conversations.cluster.handoff``). It becomes ``interrupted``
  (``conversations.chat.lifecycle``) and the tabs are told, so no row stays ``streaming``
  with nobody working on it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

from conversations.chat import lifecycle
from conversations.chat.answer_rows import owned_answers
from conversations.chat.groups import announce_finished
from conversations.chat.records import StopReason

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
        manager.stop(gen.message_id, StopReason.FENCED)
    return len(lost)


async def sweep_unattended(manager: GenerationManager) -> int:
    """Interrupt this process's ``streaming`` rows that nothing here generates; how many."""
    cutoff = timezone.now() - timedelta(seconds=unattended_seconds())
    swept = await lifecycle.interrupt_unattended(list(manager.generations), cutoff)
    for message in swept:
        log.warning("answer %s was never started here: now interrupted", message["id"])
    await announce_finished(swept, SWEEPER)
    return len(swept)
