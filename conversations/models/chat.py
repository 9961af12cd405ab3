"""Conversations and their message trees.

A conversation's messages form a tree through ``Message.parent``: siblings share a
parent (an edited question, a regenerated answer). The visible thread is the path
from a root to ``Conversation.current_leaf``; each message remembers the child last
selected under it (``active_child``) so that switching back to a branch returns to
the leaf that was showing there. The tree walks live in ``conversations.chat.tree``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

DEFAULT_TITLE = "New chat"


class LiveConversationManager(models.Manager):
    """Conversations not deleted. A deleted conversation stays (hidden) until housekeeping
    purges it after ``DELETED_CONVERSATION_RETENTION_DAYS``; related lookups
    (``message.conversation``) use the plain base manager and still reach it."""

    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(deleted_at__isnull=True)


class Conversation(models.Model):
    class TitleSource(models.TextChoices):
        AUTO = "auto"  # the default or the first line of the first message: the model may replace it
        MODEL = "model"  # written by the model after the first answer
        USER = "user"  # set by the user: never replaced
        IMPORTED = "imported"  # came with an imported file

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, default=DEFAULT_TITLE)
    title_source = models.CharField(max_length=8, choices=TitleSource.choices, default=TitleSource.AUTO)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(default=0.7)
    top_p = models.FloatField(default=0.95)
    top_k = models.IntegerField(default=0, help_text="0 disables top-k")
    max_tokens = models.IntegerField(default=512)
    # Tools through MCP (conversations.tools): offered to the model only when on, and with
    # approval on each call waits for the user's yes before it runs.
    # The model id (conversations.ops.served_models) new answers here use; empty: the default.
    model = models.CharField(max_length=200, blank=True, default="")
    tools_enabled = models.BooleanField(default=False)
    tools_approval = models.BooleanField(default=False)
    # The leaf of the visible thread; the thread is the path from the root to it.
    current_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Which first message is shown when several roots exist (an edited first message).
    active_root = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The message the prompt's kept history starts with once the thread outgrew the context:
    # later answers start there while their history fits, so their prompts share a cached
    # prefix (``conversations.chat.prompts``). Written by the answer path only.
    context_start = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # Set by "delete"; the row and its messages go when housekeeping purges it.
    deleted_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # The sidebar's organisation (conversations.workspace): pinned ones come first, a folder
    # groups them, and an archived one leaves the list but is still found by search.
    pinned = models.BooleanField(default=False)
    folder = models.ForeignKey(
        "Folder", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    archived_at = models.DateTimeField(null=True, blank=True)
    # Never in the list, search or exports, and never titled; deleted when its tab closes it
    # or after TEMPORARY_CHAT_MAX_AGE_SECONDS (housekeeping).
    temporary = models.BooleanField(default=False)

    objects = LiveConversationManager()
    all_objects = models.Manager()

    class Meta:
        base_manager_name = "all_objects"
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"  # one tool call's result, the child of the answer that made the call

    class Status(models.TextChoices):
        COMPLETE = "complete"
        STREAMING = "streaming"
        INTERRUPTED = "interrupted"
        ERROR = "error"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # The child last selected under this message, so switching back returns to the same leaf.
    active_child = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    # A reasoning model's thinking (<think> text), shown apart and never sent back to the model.
    reasoning = models.TextField(blank=True, default="")
    reasoning_seconds = models.FloatField(null=True, blank=True)
    # Token ids of this rendered turn, reused verbatim so the next turn is an exact cache hit:
    # for an answer the ids the model generated, for a user message its segment in the prompt.
    token_ids = models.JSONField(null=True, blank=True)
    # The model and tokenizer that made token_ids (conversations.chat.token_fingerprint): ids
    # are reused only under the same one; '' (rows older than this field) is never reused.
    token_fingerprint = models.CharField(max_length=128, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    error = models.TextField(blank=True, default="")
    prompt_tokens = models.IntegerField(default=0)
    completion_tokens = models.IntegerField(default=0)
    cached_tokens = models.IntegerField(default=0)
    # Earlier messages left out of this answer's prompt to fit the context window.
    context_dropped = models.IntegerField(default=0)
    model_name = models.CharField(max_length=200, blank=True, default="")
    # An answer one side-by-side send started together with its siblings (one per model);
    # its question's ``side_by_side_kept`` is set once the user keeps one of them
    # (``conversations.chat.tree.Tree.side_by_side`` decides what the page shows in columns).
    side_by_side = models.BooleanField(default=False)
    side_by_side_kept = models.BooleanField(default=False)
    # An answer that called tools: [{"id", "name", "arguments"}] (OpenAI's shape, flattened).
    # Its calls' results are its descendants: one ``tool`` message per call, in order, then
    # the answer that goes on from them (conversations.chat.tool_loop).
    tool_calls = models.JSONField(null=True, blank=True)
    # A ``tool`` message: the call it answers, the tool's name and JSON arguments, how long
    # it ran, whether its result is an error, and the user's approval ("" when not asked).
    tool_call_id = models.CharField(max_length=64, blank=True, default="")
    tool_name = models.CharField(max_length=128, blank=True, default="")
    tool_arguments = models.TextField(blank=True, default="")
    tool_duration_ms = models.FloatField(null=True, blank=True)
    tool_is_error = models.BooleanField(default=False)
    tool_approval = models.CharField(max_length=16, blank=True, default="")
    # The server process that generates (or last generated) this answer: a live answer has
    # exactly one owner, the process a stop or a snapshot request is sent to, and the next
    # turn prefers it because the conversation's KV blocks are warm in its engine.
    owner_process = models.CharField(max_length=64, blank=True, default="", db_index=True)
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Bumped by every partial save: a "streaming" message nobody has touched for a while
    # belonged to a process that died, and is shown (and stored) as interrupted.
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["conversation", "parent"]),
            models.Index(fields=["conversation", "created_at"]),
            models.Index(fields=["status"]),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"


class ModelPreference(models.Model):
    """A user's default model id: the one they last picked, given to their new conversations."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="model_preference"
    )
    model = models.CharField(max_length=200)
