"""Admin: conversations with their message trees, messages, and a read-only engine status page.

Users are administered through Django's own UserAdmin (registered by django.contrib.auth).
"""

from __future__ import annotations

import importlib.util

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from conversations.models import Conversation, Message
from conversations.models.chat import EngineStatus
from conversations.ops.engine_handle import engine_status
from conversations.ops.metrics import live_stats_json


class MessageInline(admin.TabularInline):
    model = Message
    fk_name = "conversation"
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("id", "parent", "role", "status", "excerpt", "completion_tokens", "created_at")
    readonly_fields = fields
    ordering = ("created_at", "id")

    def get_queryset(self, request):
        # The parent column would otherwise cost one query per row.
        return super().get_queryset(request).select_related("parent").defer("token_ids", "parent__token_ids")

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
    # An inline form per message costs about 10 ms to render: above this many the page
    # keeps the tree and links to the conversation's messages in the message list instead.
    INLINE_LIMIT = 200

    def get_inlines(self, request, obj):
        if obj is not None and obj.messages.count() > self.INLINE_LIMIT:
            return []
        return super().get_inlines(request, obj)

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
        from conversations.chat.tree import Tree

        tree = Tree.load(obj)
        on_thread = {m.pk for m in tree.thread()}

        def label(m: Message) -> str:
            url = reverse("admin:conversations_message_change", args=[m.pk])
            text = format_html(
                '<a href="{}">#{}</a> <b>{}</b> [{}] {}',
                url,
                m.pk,
                m.role,
                m.status,
                m.content[:80] + ("…" if len(m.content) > 80 else ""),
            )
            return format_html("<strong>{}</strong>", text) if m.pk in on_thread else text

        # Depth-first with an explicit stack, not recursion: a thread thousands of
        # messages deep must render (Python's recursion limit is about 1,000).
        roots = tree.children.get(None, [])
        if not roots:
            return "—"
        parts = []
        if len(tree.by_id) > self.INLINE_LIMIT:
            messages_url = reverse("admin:conversations_message_changelist")
            parts.append(
                format_html(
                    '<p><a href="{}?conversation__id__exact={}">All {} messages in the message list</a></p>',
                    messages_url,
                    obj.pk,
                    len(tree.by_id),
                )
            )
        parts.append("<ul>")
        stack = [iter(roots)]
        while stack:
            m = next(stack[-1], None)
            if m is None:
                stack.pop()
                parts.append("</ul></li>" if stack else "</ul>")
                continue
            parts.append("<li>" + label(m))
            kids = tree.children.get(m.pk)
            if kids:
                parts.append("<ul>")
                stack.append(iter(kids))
            else:
                parts.append("</li>")
        return mark_safe("".join(parts))  # every label went through format_html


class MessageAdminForm(forms.ModelForm):
    """A parent must be in the same conversation and may not be the message itself or
    one of its descendants: that would make a cycle, and the tree walks would never end."""

    class Meta:
        model = Message
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        parent = cleaned.get("parent")
        conversation = cleaned.get("conversation")
        if parent is None or self.instance.pk is None:
            return cleaned
        if conversation is not None and parent.conversation_id != conversation.pk:
            raise forms.ValidationError({"parent": "The parent must be in the same conversation."})
        if creates_cycle(self.instance.pk, parent.pk, parent.conversation_id):
            raise forms.ValidationError(
                {"parent": "That parent is this message or one of its replies: it would make a cycle."}
            )
        return cleaned


def creates_cycle(message_id: int, new_parent_id: int, conversation_id: int) -> bool:
    """Would ``message_id`` become its own ancestor under ``new_parent_id``? One query
    for the conversation's parent links, then a walk up (no recursion)."""
    parents = dict(Message.objects.filter(conversation_id=conversation_id).values_list("pk", "parent_id"))
    node: int | None = new_parent_id
    for _ in range(len(parents) + 1):  # a cycle already in the data cannot loop forever
        if node is None:
            return False
        if node == message_id:
            return True
        node = parents.get(node)
    return True


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    form = MessageAdminForm
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


if importlib.util.find_spec("conversations.api.admin") is not None:
    from conversations.api import admin as admin_api  # noqa: F401
