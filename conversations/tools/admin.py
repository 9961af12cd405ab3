"""MCP servers in the admin: how each is reached and which users may use it.

A stdio server runs a command of the host, so only a superuser may add one, change one, or
turn another server into one: other staff see stdio servers read-only and are not offered the
transport, and a crafted form is refused by the model's own check (``check_editor``) on
validation and again on save. HTTP URLs must be under ``MCP_HTTP_ALLOWED_URLS`` (the
model's ``clean``).
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError

from conversations.audit.admin import AuditedAdmin
from conversations.models import McpServer


class McpServerForm(forms.ModelForm):
    editor = None  # the request's user, set by the admin's get_form

    class Meta:
        model = McpServer
        fields = "__all__"

    def add_error(self, field, error):
        # The model's errors on a field this editor cannot see (a stdio server's command,
        # read-only for staff) are shown above the form rather than failing the page.
        if field is None and isinstance(error, ValidationError) and hasattr(error, "error_dict"):
            shown: dict[str, list] = {}
            for name, errors in error.error_dict.items():
                shown.setdefault(name if name in self.fields else NON_FIELD_ERRORS, []).extend(errors)
            error = ValidationError(shown)
        super().add_error(field, error)

    def clean(self):
        cleaned = super().clean()
        before = McpServer.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
        candidate = McpServer(transport=cleaned.get("transport", self.instance.transport))
        try:
            candidate.check_editor(self.editor, before)
        except PermissionDenied as exc:
            raise ValidationError(str(exc)) from None
        return cleaned


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin):
    form = McpServerForm
    list_display = ("name", "transport", "enabled", "all_users", "timeout_seconds", "updated_at")
    list_filter = ("transport", "enabled", "all_users")
    search_fields = ("name", "command", "url")
    filter_horizontal = ("users", "groups")
    fieldsets = (
        (None, {"fields": ("name", "transport", "enabled", "timeout_seconds")}),
        ("Stdio command", {"fields": ("command", "args", "env")}),
        ("Streamable HTTP", {"fields": ("url",)}),
        ("Who may use it", {"fields": ("all_users", "users", "groups")}),
    )

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"editor": request.user})

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return ()
        return ("command", "args", "env")  # a stdio server's fields: never another's to set

    def formfield_for_choice_field(self, db_field, request, **kwargs):
        if db_field.name == "transport" and not request.user.is_superuser:
            kwargs["choices"] = [c for c in McpServer.Transport.choices if c[0] != McpServer.Transport.STDIO]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.transport == McpServer.Transport.STDIO and not request.user.is_superuser:
            return False
        return super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        before = McpServer.objects.filter(pk=obj.pk).first() if change else None
        obj.check_editor(request.user, before)
        super().save_model(request, obj, form, change)
