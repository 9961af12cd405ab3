"""Admin for the workspace: rated answers (with filters and a JSONL export for preference
tuning), site-wide prompt presets, share links and folders."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpResponse
from django.utils import timezone

from conversations.audit.admin import AuditedAdmin
from conversations.models import Folder, Preset, Rating, Share
from conversations.workspace.preferences import render_jsonl


class HasReasonFilter(admin.SimpleListFilter):
    title = "reason"
    parameter_name = "has_reason"

    def lookups(self, request, model_admin):
        return [("yes", "With a reason"), ("no", "Without a reason")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.exclude(reason="")
        if self.value() == "no":
            return queryset.filter(reason="")
        return queryset


@admin.register(Rating)
class RatingAdmin(AuditedAdmin):
    list_display = ("value", "answer_excerpt", "reason", "model", "owner", "updated_at")
    list_filter = ("value", HasReasonFilter, "message__model_name", "updated_at")
    search_fields = ("reason", "message__content", "message__conversation__owner__username")
    date_hierarchy = "updated_at"
    list_select_related = ("message", "message__conversation", "message__conversation__owner")
    raw_id_fields = ("message",)
    readonly_fields = ("created_at", "updated_at")
    actions = ["export_jsonl"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("message__token_ids")

    @admin.display(description="answer")
    def answer_excerpt(self, obj: Rating) -> str:
        text = obj.message.content
        return (text[:100] + "…") if len(text) > 100 else text

    @admin.display(description="model", ordering="message__model_name")
    def model(self, obj: Rating) -> str:
        return obj.message.model_name

    @admin.display(description="user", ordering="message__conversation__owner__username")
    def owner(self, obj: Rating) -> str:
        return obj.message.conversation.owner.get_username()

    @admin.action(description="Export the selected ratings as JSONL (with chosen/rejected pairs)")
    def export_jsonl(self, request, queryset):
        ratings = queryset.select_related("message", "message__conversation").order_by("message_id")
        response = HttpResponse(render_jsonl(ratings), content_type="application/jsonl; charset=utf-8")
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="ratings-{stamp}.jsonl"'
        return response


@admin.register(Preset)
class PresetAdmin(AuditedAdmin):
    """Presets without an owner are site-wide: every user is offered them."""

    list_display = ("name", "owner", "temperature", "top_p", "top_k", "max_tokens")
    list_filter = (("owner", admin.EmptyFieldListFilter),)
    search_fields = ("name", "system_prompt")
    raw_id_fields = ("owner",)


@admin.register(Share)
class ShareAdmin(AuditedAdmin):
    list_display = ("title", "owner", "created_at", "revoked_at")
    list_filter = ("created_at", "revoked_at")
    search_fields = ("title", "owner__username", "token")
    raw_id_fields = ("owner", "conversation")
    readonly_fields = ("token", "created_at")
    exclude = ("messages",)


@admin.register(Folder)
class FolderAdmin(AuditedAdmin):
    list_display = ("name", "owner", "created_at")
    search_fields = ("name", "owner__username")
    raw_id_fields = ("owner",)
