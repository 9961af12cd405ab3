"""Admin for accounts: the provider identities of single sign-on users, and token quotas."""

from __future__ import annotations

from django.contrib import admin

from conversations.audit.admin import AuditedAdmin
from conversations.models import ExternalIdentity, TokenQuota


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(AuditedAdmin):
    """Which provider account each SSO user is; made at their first sign-in, never typed."""

    list_display = ("user", "subject", "issuer", "created_at", "last_sign_in_at")
    search_fields = ("user__username", "subject")
    list_select_related = ("user",)
    readonly_fields = ("user", "issuer", "subject", "created_at", "last_sign_in_at")

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(TokenQuota)
class TokenQuotaAdmin(AuditedAdmin):
    """Token budgets of a user or a group (a group's is shared by its members); empty: no limit."""

    list_display = (
        "__str__",
        "prompt_tokens_per_day",
        "completion_tokens_per_day",
        "prompt_tokens_per_month",
        "completion_tokens_per_month",
        "cached_prompt_discount",
        "updated_at",
    )
    raw_id_fields = ("user",)
    list_select_related = ("user", "group")
    search_fields = ("user__username", "group__name")
