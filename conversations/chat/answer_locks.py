"""The row locks a tree edit takes, and the site-wide limits on live answers checked under them.

Every change to a conversation's tree locks the conversation's row first (``select_for_update``),
so edits from several processes apply one after the other on a fresh tree. Edits that start an
answer also lock the owner's user row (always user first, then conversation) and count the user's
live answers under those locks: one per conversation and ``MAX_LIVE_PER_USER`` per user, counted
in the database whichever process generates them.

All functions here are synchronous and run inside the caller's transaction.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from conversations.accounts.user_lock import lock_user
from conversations.chat.tree_errors import Busy, NotInConversation
from conversations.models import Conversation, Message
from conversations.prepared_queries import PreparedRead

# A streaming row untouched this long with no known owner was left by a process that died.
LEGACY_STALE_SECONDS = 60.0

_locked_conversation = PreparedRead(
    lambda pk: Conversation.objects.select_for_update().filter(pk=pk).order_by()[:1]
)
_streaming_rows_of_user = PreparedRead(
    lambda owner_id: Message.objects.filter(
        status=Message.Status.STREAMING, conversation__owner_id=owner_id
    ).values_list("conversation_id", "owner_process", "updated_at")
)


def lock_conversation(conversation: Conversation) -> Conversation:
    """Lock the conversation's row for this transaction and refresh ``conversation`` from it
    (another process or tab may have moved its current leaf or changed its settings)."""
    fresh = next(iter(_locked_conversation(conversation.pk)), None)
    if fresh is None:
        raise NotInConversation("this conversation no longer exists")
    for column in Conversation._meta.concrete_fields:
        setattr(conversation, column.attname, getattr(fresh, column.attname))
    return conversation


def live_answer_conversations(owner_id: int, live_processes: set[str]) -> list[int]:
    """The conversation of each of the user's streaming answers that still counts as live:
    owned by a live process, or without a recorded owner and touched recently. (The user's
    streaming rows are few: they are read and judged here, a query that costs less to
    build than its counting in SQL.)"""
    cutoff = timezone.now() - timedelta(seconds=LEGACY_STALE_SECONDS)
    rows = _streaming_rows_of_user(owner_id)
    return [
        conversation_id
        for conversation_id, owner, touched in rows
        if owner in live_processes or (owner == "" and touched >= cutoff)
    ]


def lock_for_answer(
    conversation: Conversation, live_processes: set[str] | None, beside_live: bool = False
) -> Conversation:
    """Lock the owner's user row, then the conversation's, and check the site-wide limits
    counting the answers of ``live_processes`` (the chat consumer always passes them).

    The user lock serialises every answer-starting edit of one user (from any process), so
    the count cannot race; on SQLite the IMMEDIATE transaction already serialises writers
    (and row locks do not exist), so the user's row is not read there."""
    lock_user(conversation.owner_id)
    lock_conversation(conversation)
    if live_processes is None:  # not going to be generated (fixtures, imports): no limits
        return conversation
    # The user's live answers, and those of this conversation (all the user's), in one query.
    live = live_answer_conversations(conversation.owner_id, live_processes)
    if conversation.pk in live and not beside_live:
        raise Busy("An answer is still being written here: wait for it or stop it first.")
    # ``beside_live``: a side-by-side answer, generated beside its siblings (counted too).
    if len(live) + (beside_live and conversation.pk in live) >= settings.MAX_LIVE_PER_USER:
        raise Busy("You have too many answers being written at once; wait for one to finish.")
    return conversation
