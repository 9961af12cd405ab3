"""Share links: a frozen copy of a conversation's visible branch, who may read it, and
"Continue in my account" (a fork of the copy, token ids included).

The copy is taken once, into the share's own row: later edits, branches or the deletion of
the conversation do not change what the link shows.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from conversations.accounts.access import access_for
from conversations.chat.tree import Busy, Tree, select_leaf
from conversations.models import Conversation, Message, Share
from conversations.transfer.exporting import SETTINGS_FIELDS

# Each copied message carries what the page shows and what a fork needs to start warm.
SNAPSHOT_FIELDS = (
    "role",
    "content",
    "reasoning",
    "reasoning_seconds",
    "status",
    "finish_reason",
    "model_name",
    "token_fingerprint",
)


def take_snapshot(conversation: Conversation) -> Share:
    """A share of ``conversation``'s visible branch as it is now."""
    tree = Tree.load(conversation)
    thread = tree.thread()
    if any(m.status == Message.Status.STREAMING for m in thread):
        raise Busy("an answer is still being written: share once it has finished")
    stored = dict(Message.objects.filter(pk__in=[m.pk for m in thread]).values_list("pk", "token_ids"))
    messages = [
        {
            **{name: getattr(m, name) for name in SNAPSHOT_FIELDS},
            "token_ids": stored.get(m.pk),
            "created_at": m.created_at.isoformat() if m.created_at else None,
        }
        for m in thread
    ]
    return Share.objects.create(
        owner=conversation.owner,
        conversation=conversation,
        title=conversation.title,
        settings={name: getattr(conversation, name) for name in SETTINGS_FIELDS},
        messages=messages,
    )


def may_read(share: Share | None, user) -> bool:
    """Whether ``user`` (perhaps anonymous) may read ``share``: a live share, for any signed-in
    user of the site, or for anyone when the admin allows public shares and the owner's groups
    allow public sharing."""
    if share is None or not share.is_active:
        return False
    if user.is_authenticated:
        return True
    return settings.ALLOW_PUBLIC_SHARES and access_for(share.owner_id).public_sharing


def _clean_token_ids(value) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


@transaction.atomic
def fork_share(share: Share, user) -> Conversation:
    """A new conversation of ``user`` holding the shared branch, with the stored token ids
    (and the tokenizer fingerprint that made them) so its next turn reuses them verbatim."""
    known = {name: share.settings[name] for name in SETTINGS_FIELDS if name in share.settings}
    conversation = Conversation.objects.create(owner=user, title=share.title, **known)
    tree = Tree(conversation)
    parent = None
    for item in share.messages:
        fields = {name: item.get(name) for name in SNAPSHOT_FIELDS if item.get(name) is not None}
        copy = Message.objects.create(
            conversation=conversation,
            parent=parent,
            token_ids=_clean_token_ids(item.get("token_ids")),
            **fields,
        )
        tree.add(copy)
        parent = copy
    select_leaf(tree, parent)
    return conversation
