"""Admin for API keys (create with the key shown once, revoke) and the API usage log.

Imported by ``conversations.admin``, the admin registry.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.html import format_html

from conversations.audit.admin import AuditedAdmin
from conversations.audit.log import Action, record
from conversations.models import ApiKey, ApiRequest


class RevokedFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return (("active", "Active"), ("revoked", "Revoked"))

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin):
    list_display = (
        "prefix_display",
        "name",
        "owner",
        "created_at",
        "last_used_at",
        "request_count",
        "status",
    )
    list_filter = (RevokedFilter, "created_at")
    list_select_related = ("owner",)
    search_fields = ("prefix", "name", "owner__username")
    raw_id_fields = ("owner",)
    actions = ["revoke_keys"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_requests=Count("requests"))

    def get_fields(self, request, obj=None):
        if obj is None:  # adding: the secret is generated, never typed
            return ("owner", "name")
        return (
            "owner",
            "name",
            "rate_limit_per_minute",
            "prefix_display",
            "created_at",
            "last_used_at",
            "revoked_at",
            "request_count",
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("owner", "prefix_display", "created_at", "last_used_at", "revoked_at", "request_count")

    @admin.display(description="key", ordering="prefix")
    def prefix_display(self, obj: ApiKey) -> str:
        return f"{obj.prefix}…" if obj.prefix else "—"

    @admin.display(description="requests", ordering="_requests")
    def request_count(self, obj: ApiKey) -> int:
        return getattr(obj, "_requests", None) if hasattr(obj, "_requests") else obj.requests.count()

    @admin.display(description="status", ordering="revoked_at")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked_at:
            return format_html(
                '<span style="color:#cf222e">revoked {}</span>', obj.revoked_at.strftime("%Y-%m-%d %H:%M")
            )
        return "active"

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        if not change:
            raw = obj.set_new_key()
            with transaction.atomic():
                super().save_model(request, obj, form, change)
                record(
                    Action.API_KEY_CREATE,
                    target=obj,
                    request=request,
                    detail={"for": obj.owner.get_username()},
                )
            messages.warning(
                request,
                f"The new API key for {obj.owner} is {raw} — copy it now: it is stored hashed and will not be shown again.",
            )
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request, queryset) -> None:
        with transaction.atomic():
            # The list's queryset counts requests (GROUP BY): the rows are locked by key alone.
            ids = list(queryset.values_list("pk", flat=True))
            live = list(ApiKey.objects.select_for_update().filter(pk__in=ids, revoked_at__isnull=True))
            count = ApiKey.objects.filter(pk__in=[k.pk for k in live]).update(revoked_at=timezone.now())
            for key in live:
                record(Action.API_KEY_REVOKE, target=key, request=request)
        self.message_user(request, f"Revoked {count} key{'s' if count != 1 else ''}.", messages.SUCCESS)


@admin.register(ApiRequest)
class ApiRequestAdmin(AuditedAdmin):
    """The usage log: read-only."""

    list_display = (
        "created_at",
        "owner",
        "key",
        "endpoint",
        "model",
        "status_code",
        "stream",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "duration_ms",
    )
    list_filter = ("endpoint", "status_code", "stream", "created_at")
    list_select_related = ("owner", "key")
    search_fields = ("owner__username", "key__prefix", "request_id", "model")
    date_hierarchy = "created_at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
