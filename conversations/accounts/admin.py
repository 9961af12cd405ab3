"""Admin for accounts: the provider identities of single sign-on users."""

from __future__ import annotations

from django.contrib import admin

from conversations.audit.admin import AuditedAdmin
from conversations.models import ExternalIdentity


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(AuditedAdmin):
    """Which provider account each SSO user is; made at their first sign-in, never typed."""

    list_display = ("user", "subject", "issuer", "created_at", "last_sign_in_at")
    search_fields = ("user__username", "subject")
    list_select_related = ("user",)
    readonly_fields = ("user", "issuer", "subject", "created_at", "last_sign_in_at")

    def has_add_permission(self, request) -> bool:
        return False
