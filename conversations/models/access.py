"""What a group's members may use: models, the API, sharing, document caps, and (for the
engine) token quotas and a fair-share weight. One optional row per Django group; a user's
rights are the union of their groups' rows (``conversations.accounts.access``)."""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models


class GroupAccess(models.Model):
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="access")
    allowed_models = models.JSONField(
        default=list,
        blank=True,
        help_text='Model names its members may use, e.g. ["SmolLM2-135M-Instruct"]; empty: every model.',
    )
    api = models.BooleanField(default=True, help_text="May use the OpenAI-compatible API (/v1) with keys.")
    sharing = models.BooleanField(default=True, help_text="May create share links.")
    public_sharing = models.BooleanField(
        default=True, help_text="Their links may be read without an account (when ALLOW_PUBLIC_SHARES is on)."
    )
    document_max_files = models.PositiveIntegerField(
        null=True, blank=True, help_text="Files per member; empty: DOCUMENT_USER_MAX_FILES."
    )
    document_max_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes of files per member; empty: DOCUMENT_USER_MAX_BYTES."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "group access"
        verbose_name_plural = "group access"

    def __str__(self) -> str:
        return f"access of {self.group}"

    def clean(self) -> None:
        names = self.allowed_models
        if not isinstance(names, list) or not all(isinstance(m, str) and m for m in names):
            raise ValidationError({"allowed_models": "A list of model names."})
