""" "Continue in a new conversation": the path from the root to one message, copied.

The copies keep their stored token ids, so the new conversation's next prompt renders to
the same ids as the original's and its first answer is served from the prefix cache.
"""

from __future__ import annotations

from django.db import transaction

from conversations.chat.tree import Busy, NotInConversation, TemporaryChat, Tree, select_leaf
from conversations.models import Conversation, Message
from conversations.transfer.exporting import MESSAGE_FIELDS, SETTINGS_FIELDS, TOOL_MESSAGE_FIELDS

# What an export carries, plus what only a copy on this site can reuse: the token ids (so
# the fork's first answer hits the prefix cache), the tokenizer that made them, and the
# model that wrote each answer.
COPIED_FIELDS = (*MESSAGE_FIELDS, *TOOL_MESSAGE_FIELDS, "token_ids", "token_fingerprint", "model_name")


@transaction.atomic
def fork_at(owner, message_id) -> Conversation:
    """A new conversation of ``owner`` holding the path to ``message_id`` (one of theirs).

    Raises :class:`NotInConversation` for a message that is not theirs or does not exist."""
    try:
        source = Message.objects.select_related("conversation").get(
            pk=int(message_id), conversation__owner=owner, conversation__deleted_at__isnull=True
        )
    except (Message.DoesNotExist, TypeError, ValueError):
        raise NotInConversation(f"no message {message_id!r} among your conversations") from None
    original = source.conversation
    if original.temporary:
        # A temporary chat is never kept: a copy of it would be a permanent one.
        raise TemporaryChat("a temporary chat cannot be continued in a new conversation")
    tree = Tree.load(original)
    path = tree.path_to(tree.get(source.pk))
    if any(m.status == Message.Status.STREAMING for m in path):
        raise Busy("this answer is still being written: wait for it to finish first")
    stored = dict(Message.objects.filter(pk__in=[m.pk for m in path]).values_list("pk", "token_ids"))
    conversation = Conversation.objects.create(
        owner=owner,
        title=original.title,
        title_source=original.title_source,
        **{name: getattr(original, name) for name in SETTINGS_FIELDS},
    )
    copy_tree = Tree(conversation)
    parent = None
    for message in path:
        message.token_ids = stored.get(message.pk)
        copy = Message.objects.create(
            conversation=conversation,
            parent=parent,
            **{name: getattr(message, name) for name in COPIED_FIELDS},
        )
        copy_tree.add(copy)
        parent = copy
    select_leaf(copy_tree, parent)
    return conversation
