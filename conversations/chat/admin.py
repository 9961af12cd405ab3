"""Admin for conversations (with their message trees) and messages."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from conversations.audit.admin import AuditedAdmin
from conversations.chat.tree import Tree
from conversations.models import Conversation, Message


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
class ConversationAdmin(AuditedAdmin):
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
class MessageAdmin(AuditedAdmin):
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
