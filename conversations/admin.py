"""Admin: conversations with their message trees, messages, and a read-only engine status page.

Users are administered through Django's own UserAdmin (registered by django.contrib.auth).
"""

from __future__ import annotations

import importlib.util

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from conversations.engine import engine_status
from conversations.metrics import live_stats_json
from conversations.models import Conversation, Message
from conversations.models.chat import EngineStatus


class MessageInline(admin.TabularInline):
    model = Message
    fk_name = "conversation"
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("id", "parent", "role", "status", "excerpt", "completion_tokens", "created_at")
    readonly_fields = fields
    ordering = ("created_at", "id")

    @admin.display(description="content")
    def excerpt(self, obj: Message) -> str:
        return (obj.content[:120] + "…") if len(obj.content) > 120 else obj.content

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "message_count", "updated_at", "created_at")
    list_select_related = ("owner",)
    search_fields = ("title", "owner__username", "messages__content")
    list_filter = ("created_at",)
    date_hierarchy = "updated_at"
    readonly_fields = ("created_at", "updated_at", "message_tree")
    raw_id_fields = ("owner", "current_leaf", "active_root")
    fieldsets = (
        (None, {"fields": ("owner", "title", "created_at", "updated_at")}),
        ("Settings", {"fields": ("system_prompt", "temperature", "top_p", "top_k", "max_tokens")}),
        ("Tree", {"fields": ("current_leaf", "active_root", "message_tree")}),
    )
    inlines = [MessageInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_message_count=Count("messages", distinct=True))

    @admin.display(description="messages", ordering="_message_count")
    def message_count(self, obj: Conversation) -> int:
        return getattr(obj, "_message_count", 0)

    @admin.display(description="message tree")
    def message_tree(self, obj: Conversation) -> str:
        """The whole tree as nested lists: parent links, roles, statuses; the thread in bold."""
        if obj.pk is None:
            return "—"
        from conversations.tree import Tree

        tree = Tree.load(obj)
        on_thread = {m.pk for m in tree.thread()}

        def render(parent_id) -> str:
            kids = tree.children.get(parent_id, [])
            if not kids:
                return ""
            items = []
            for m in kids:
                url = reverse("admin:conversations_message_change", args=[m.pk])
                label = format_html(
                    '<a href="{}">#{}</a> <b>{}</b> [{}] {}',
                    url,
                    m.pk,
                    m.role,
                    m.status,
                    m.content[:80] + ("…" if len(m.content) > 80 else ""),
                )
                if m.pk in on_thread:
                    label = format_html("<strong>{}</strong>", label)
                items.append(format_html("<li>{}{}</li>", label, mark_safe(render(m.pk))))
            return format_html("<ul>{}</ul>", mark_safe("".join(items)))

        return mark_safe(render(None)) or "—"


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "parent_id",
        "role",
        "status",
        "excerpt",
        "completion_tokens",
        "created_at",
    )
    list_filter = ("role", "status", "created_at")
    list_select_related = ("conversation",)
    search_fields = ("content", "conversation__title", "conversation__owner__username")
    raw_id_fields = ("conversation", "parent", "active_child")
    readonly_fields = ("created_at", "updated_at", "children_links")

    @admin.display(description="content")
    def excerpt(self, obj: Message) -> str:
        return (obj.content[:80] + "…") if len(obj.content) > 80 else obj.content

    @admin.display(description="children")
    def children_links(self, obj: Message) -> str:
        kids = list(obj.children.order_by("created_at", "id").values_list("pk", "role", "status"))
        if not kids:
            return "—"
        return format_html_join(
            ", ",
            '<a href="{}">#{} {} [{}]</a>',
            (
                (reverse("admin:conversations_message_change", args=[pk]), pk, role, status)
                for pk, role, status in kids
            ),
        )


@admin.register(EngineStatus)
class EngineStatusAdmin(admin.ModelAdmin):
    """A read-only page of the engine's live numbers (never loads the model itself)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    def get_urls(self):
        live = path(
            "live/", self.admin_site.admin_view(self.live_view), name="conversations_enginestatus_live"
        )
        return [live, *super().get_urls()]

    def live_view(self, request):
        """The page's figures as JSON, polled by static/js/engine_status.js."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return live_stats_json(request)

    def changelist_view(self, request, extra_context=None):
        status = engine_status()
        stats = status.get("stats") or {}
        rows = [
            ("State", status.get("state", ""), "state"),
            ("Model", status.get("model", "—"), "model"),
            ("Running requests", stats.get("running", "—"), "running"),
            ("Waiting requests", stats.get("waiting", "—"), "waiting"),
            ("Loading KV requests", stats.get("loading", "—"), "loading"),
            ("KV blocks total", stats.get("kv_blocks_total", "—"), "kv_blocks_total"),
            ("KV blocks used", stats.get("kv_blocks_used", "—"), "kv_blocks_used"),
            ("KV blocks cached", stats.get("kv_blocks_cached", "—"), "kv_blocks_cached"),
            ("KV blocks free", stats.get("kv_blocks_free", "—"), "kv_blocks_free"),
            ("Prefix cache hit rate", _percent(stats.get("prefix_hit_rate")), "prefix_hit_rate"),
            ("Prefix hit tokens", stats.get("prefix_hit_tokens", "—"), "prefix_hit_tokens"),
            ("Tokens per second", _number(stats.get("tokens_per_s")), "tokens_per_s"),
            ("Preemptions", stats.get("num_preemptions", "—"), "num_preemptions"),
            ("Swaps", stats.get("num_swaps", "—"), "num_swaps"),
        ]
        shown = {key for _, _, key in rows}
        # Structured figures (histograms, per-tier and per-outcome tables) have their own
        # places: the tiers table, /metrics.
        shown |= {"requests_by_outcome", "ttft", "tpot", "kv_tiers", "extra"}
        extra = [(key.replace("_", " "), value) for key, value in stats.items() if key not in shown]
        extra += [(key.replace("_", " "), value) for key, value in stats.get("extra", {}).items()]
        extra += [(f"requests {k}", v) for k, v in stats.get("requests_by_outcome", {}).items()]
        context = {
            **self.admin_site.each_context(request),
            "title": "Engine status",
            "opts": self.model._meta,
            "rows": rows,
            "extra_rows": extra,
            "error": status.get("error"),
            "live_url": reverse("admin:conversations_enginestatus_live"),
            "poll_seconds": 2,
        }
        return TemplateResponse(request, "admin/engine_status.html", context)


def _percent(value) -> str:
    return f"{value * 100:.1f} %" if isinstance(value, int | float) else "—"


def _number(value) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "—"


if importlib.util.find_spec("conversations.admin_api") is not None:
    from conversations import admin_api  # noqa: F401
