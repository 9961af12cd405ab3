"""The audit log in the admin: a read-only list with filters, and its JSONL export; and
``AuditedAdmin``, the base of every model admin of the site, whose deletions are logged.

No one edits entries here: adding, changing and deleting are refused for every user,
superusers included (the model and a database trigger refuse them too).
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path
from django.utils import timezone

from conversations.audit.log import Action, record
from conversations.models import GroupAccess
from conversations.models.audit import AuditEvent

EXPORT_CHUNK = 2000


class AuditedAdmin(admin.ModelAdmin):
    """A model admin whose deletions (the delete page and the "delete selected" action) each
    write an ``admin.delete`` entry in the deletion's transaction."""

    def delete_model(self, request, obj) -> None:
        with transaction.atomic():
            _log_deletion(obj)
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset) -> None:
        with transaction.atomic():
            for obj in queryset:
                _log_deletion(obj)
            super().delete_queryset(request, queryset)


def _log_deletion(obj) -> None:
    record(Action.ADMIN_DELETE, target=obj)


class ActorFilter(admin.SimpleListFilter):
    title = "actor"
    parameter_name = "actor"

    def lookups(self, request, model_admin):
        return [("anonymous", "Anonymous or system")]

    def queryset(self, request, queryset):
        if self.value() == "anonymous":
            return queryset.filter(actor_id__isnull=True)
        return queryset


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor_name", "address", "action", "object_type", "object_repr")
    list_filter = ("action", "object_type", ActorFilter, "created_at")
    search_fields = ("actor_name", "object_repr", "object_id", "address")
    date_hierarchy = "created_at"
    readonly_fields = (
        "created_at",
        "actor_id",
        "actor_name",
        "address",
        "action",
        "object_type",
        "object_id",
        "object_repr",
        "detail",
    )
    change_list_template = "admin/audit_changelist.html"
    actions = None

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        export = path(
            "export.jsonl",
            self.admin_site.admin_view(self.export_view),
            name="conversations_auditevent_export",
        )
        return [export, *super().get_urls()]

    def export_view(self, request: HttpRequest) -> StreamingHttpResponse:
        """The entries the list shows with its current filters and search, as JSON lines,
        oldest first. The export itself is an entry."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        queryset = changelist.get_queryset(request).order_by("created_at", "id")
        filters = {k: v for k, v in request.GET.items()}
        with transaction.atomic():
            record(Action.AUDIT_EXPORT, request=request, detail={"filters": filters})
        response = StreamingHttpResponse(_lines(queryset), content_type="application/jsonl; charset=utf-8")
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.jsonl"'
        response["Cache-Control"] = "private, no-store"
        return response


def _lines(queryset) -> Iterator[bytes]:
    for entry in queryset.iterator(chunk_size=EXPORT_CHUNK):
        yield orjson.dumps(entry.as_record()) + b"\n"


# Django's own user and group admins, with their deletions logged like the site's.
User = get_user_model()
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    pass


class GroupAccessInline(admin.StackedInline):
    model = GroupAccess
    can_delete = True
    extra = 0
    max_num = 1
    verbose_name = "what members may use"
    verbose_name_plural = "what members may use (none: the site's defaults)"


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    inlines = [GroupAccessInline]
