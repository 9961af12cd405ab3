"""The workspace around the chat: folders, share links, ratings of answers and prompt presets.

Pins, folders, the archive and temporary chats are fields of ``Conversation`` (``pinned``,
``folder``, ``archived_at``, ``temporary``); the rows here are what has a life of its own.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

FOLDER_NAME_LENGTH = 80


class Folder(models.Model):
    """One level only: a folder holds conversations, never other folders."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="folders")
    name = models.CharField(max_length=FOLDER_NAME_LENGTH)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="folder_unique_name")]

    def __str__(self) -> str:
        return self.name


def new_share_token() -> str:
    return secrets.token_urlsafe(24)


class Share(models.Model):
    """A frozen copy of one conversation's visible branch, read through an unguessable link.

    The copy lives in ``messages`` (a list of message dicts, token ids included so that
    "Continue in my account" starts warm); later edits of the conversation, or its deletion,
    do not change it. Only the owner's conversation title is shown, never their name."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shares")
    conversation = models.ForeignKey(
        "Conversation", null=True, blank=True, on_delete=models.SET_NULL, related_name="shares"
    )
    token = models.CharField(max_length=64, unique=True, default=new_share_token, editable=False)
    title = models.CharField(max_length=200)
    # The conversation's system prompt and sampling settings when it was shared.
    settings = models.JSONField(default=dict)
    messages = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.title} ({self.token[:6]}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Rating(models.Model):
    """A thumbs up or down on one answer, by the conversation's owner, with an optional reason."""

    class Value(models.IntegerChoices):
        UP = 1, "thumbs up"
        DOWN = -1, "thumbs down"

    message = models.OneToOneField("Message", on_delete=models.CASCADE, related_name="rating")
    value = models.SmallIntegerField(choices=Value.choices)
    reason = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_value_display()} on message {self.message_id}"


def ratings_for(message_ids: list[int]) -> dict[int, dict]:
    """``{message id: {"value", "reason"}}`` for the rated ones among ``message_ids``."""
    if not message_ids:
        return {}
    rows = Rating.objects.filter(message_id__in=message_ids).values_list("message_id", "value", "reason")
    return {mid: {"value": value, "reason": reason} for mid, value, reason in rows}


class Preset(models.Model):
    """A saved system prompt with sampling settings; ``owner`` empty means site-wide (set by
    the admin, offered to everyone)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="presets"
    )
    name = models.CharField(max_length=80)
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(default=0.7)
    top_p = models.FloatField(default=0.95)
    top_k = models.IntegerField(default=0)
    max_tokens = models.IntegerField(default=512)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name if self.owner_id else f"{self.name} (site-wide)"

    @property
    def site_wide(self) -> bool:
        return self.owner_id is None
