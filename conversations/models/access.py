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
    scheduler_weight = models.FloatField(
        default=1.0, help_text="Fair share when the engine is busy: a weight of 3 is served as three users."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "group access"
        verbose_name_plural = "group access"

    def __str__(self) -> str:
        return f"access of {self.group}"

    def clean(self) -> None:
        if self.scheduler_weight <= 0:
            raise ValidationError({"scheduler_weight": "Must be positive."})
        names = self.allowed_models
        if not isinstance(names, list) or not all(isinstance(m, str) and m for m in names):
            raise ValidationError({"allowed_models": "A list of model names."})


class TokenQuota(models.Model):
    """Token budgets of one user or one group (a group's budget is shared by its members):
    prompt and completion tokens per UTC day and per calendar month; empty: no limit.
    Enforced at admission and, for completion tokens, by the engine step by step
    (``conversations.accounts.quota``)."""

    user = models.OneToOneField(
        "auth.User", null=True, blank=True, on_delete=models.CASCADE, related_name="token_quota"
    )
    group = models.OneToOneField(
        Group, null=True, blank=True, on_delete=models.CASCADE, related_name="token_quota"
    )
    prompt_tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    prompt_tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    completion_tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    completion_tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    cached_prompt_discount = models.FloatField(
        default=0.0,
        help_text="Share of a cached prompt token not counted: 0 counts it fully, 1 not at all.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=True, group__isnull=False)
                | models.Q(user__isnull=False, group__isnull=True),
                name="quota_of_a_user_or_a_group",
            )
        ]

    def __str__(self) -> str:
        return f"token quota of {self.user or self.group}"

    def clean(self) -> None:
        if not 0.0 <= self.cached_prompt_discount <= 1.0:
            raise ValidationError({"cached_prompt_discount": "Between 0 and 1."})
