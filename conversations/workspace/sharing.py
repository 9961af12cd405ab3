"""Share links: a frozen copy of what a conversation's page shows, who may read it, and
"Continue in my account" (a fork of the copy).

The copy is taken once, into the share's own row: later edits, branches or the deletion of
the conversation do not change what the link shows. It is text only, the questions and
answers the page shows: no tool nodes (their results can hold the owner's other
conversations or documents), no tool calls, and no stored token ids (a question's ids
carry the passages retrieved from the owner's documents, which the page never shows). A
continued copy takes the share's system prompt, sampling settings and model, never the owner's
tool settings: the reader's conversation starts with their own defaults for those.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction

from conversations.accounts.access import access_for
from conversations.chat.tree import Busy, Tree, select_leaf
from conversations.models import Conversation, Message, Share
from conversations.ops.window_counts import add_one

HOUR_S = 3600

# Each copied message carries what the page shows, nothing the page hides.
SNAPSHOT_FIELDS = (
    "role",
    "content",
    "reasoning",
    "reasoning_seconds",
    "status",
    "finish_reason",
    "model_name",
)
# The conversation settings a share carries and a continued copy takes: never tools.
SHARED_SETTINGS = ("system_prompt", "temperature", "top_p", "top_k", "max_tokens", "model")
SHOWN_ROLES = (Message.Role.USER, Message.Role.ASSISTANT)


def shown_messages(messages: list[dict]) -> list[dict]:
    """What a share page shows of ``messages`` (dicts, oldest first): questions and answers
    with text, an answer's steps around tool calls joined into one answer as the page reads
    them. Applied when a share is taken and again when one is read or continued, so a share
    stored with more than this never hands it on."""
    shown: list[dict] = []
    for item in messages:
        if item.get("role") not in SHOWN_ROLES:
            continue
        fields = {name: item.get(name) for name in SNAPSHOT_FIELDS if item.get(name) is not None}
        fields["content"] = fields.get("content") if isinstance(fields.get("content"), str) else ""
        if item.get("created_at"):
            fields["created_at"] = item["created_at"]
        if fields["role"] == Message.Role.ASSISTANT and not fields["content"].strip():
            continue  # an answer that only called tools shows nothing
        last = shown[-1] if shown else None
        if last is not None and last["role"] == fields["role"] == Message.Role.ASSISTANT:
            last["content"] = f"{last['content']}\n\n{fields['content']}"
            for name in ("status", "finish_reason", "model_name"):
                if name in fields:
                    last[name] = fields[name]
            continue
        shown.append(fields)
    return shown


def take_snapshot(conversation: Conversation) -> Share:
    """A share of ``conversation``'s visible branch as it is now."""
    tree = Tree.load(conversation)
    thread = tree.thread()
    if any(m.status == Message.Status.STREAMING for m in thread):
        raise Busy("an answer is still being written: share once it has finished")
    messages = shown_messages(
        [
            {
                **{name: getattr(m, name) for name in SNAPSHOT_FIELDS},
                "created_at": m.created_at.isoformat() if m.created_at else None,
            }
            for m in thread
        ]
    )
    return Share.objects.create(
        owner=conversation.owner,
        conversation=conversation,
        title=conversation.title,
        settings={name: getattr(conversation, name) for name in SHARED_SETTINGS},
        messages=messages,
    )


class ShareLimit(Exception):
    """Over a share cap; ``status`` is the HTTP answer (409: too many live links, 429: too
    many in the last hour) and the message says which, and what to do."""

    def __init__(self, message: str, status: int, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def _window_count(kind: str, user_id: int) -> None:
    """Count one share (or continued copy) of ``user_id`` in this hour; over
    ``SHARES_PER_HOUR`` raises :class:`ShareLimit` (0: no limit)."""
    limit = int(settings.SHARES_PER_HOUR)
    if limit <= 0:
        return
    now = time.time()
    window = int(now // HOUR_S)
    if add_one(f"share-rate:{kind}:{user_id}:{window}", HOUR_S + 5) > limit:
        retry_after = max(1, int((window + 1) * HOUR_S - now + 0.999))
        noun = "share links" if kind == "create" else "shared conversations continued"
        raise ShareLimit(f"Too many {noun} in the last hour ({limit}): try again later.", 429, retry_after)


def check_share_caps(user) -> None:
    """Before a new share of ``user``: at most ``SHARE_MAX_PER_USER`` live links each (a
    revoked one frees its place and its copy), and ``SHARES_PER_HOUR`` new ones an hour."""
    cap = int(settings.SHARE_MAX_PER_USER)
    if cap > 0 and Share.objects.filter(owner=user, revoked_at__isnull=True).count() >= cap:
        raise ShareLimit(f"You have {cap} share links, the most allowed: revoke one on My shares first.", 409)
    _window_count("create", user.pk)


def check_continue_caps(user) -> None:
    """Before a continued copy: counted like new shares, each copies a whole branch."""
    _window_count("continue", user.pk)


def may_read(share: Share | None, user) -> bool:
    """Whether ``user`` (perhaps anonymous) may read ``share``: a live share, for any signed-in
    user of the site, or for anyone when the admin allows public shares and the owner's groups
    allow public sharing."""
    if share is None or not share.is_active:
        return False
    if user.is_authenticated:
        return True
    return settings.ALLOW_PUBLIC_SHARES and access_for(share.owner_id).public_sharing


@transaction.atomic
def fork_share(share: Share, user) -> Conversation:
    """A new conversation of ``user`` holding the shared text. Its prompt is rendered afresh
    from that text (no stored ids), and its tool settings are the reader's defaults."""
    known = {name: share.settings[name] for name in SHARED_SETTINGS if name in share.settings}
    conversation = Conversation.objects.create(owner=user, title=share.title, **known)
    tree = Tree(conversation)
    parent = None
    for item in shown_messages(share.messages):
        fields = {name: item[name] for name in SNAPSHOT_FIELDS if name in item}
        copy = Message.objects.create(conversation=conversation, parent=parent, **fields)
        tree.add(copy)
        parent = copy
    select_leaf(tree, parent)
    return conversation
