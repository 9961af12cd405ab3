"""MCP servers in the admin: how each is reached and which users may use it."""

from django.contrib import admin

from conversations.audit.admin import AuditedAdmin
from conversations.models import McpServer


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin):
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
