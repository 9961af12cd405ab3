"""MCP servers an admin registers, and who may use each one.

A server is a stdio command (started per use, speaking MCP on its stdin/stdout), a
streamable HTTP URL, or the site's own built-in server (``conversations.tools.builtin_server``,
started as ``python -m`` of that module). The chat offers a conversation the tools of every
enabled server its owner may use (``conversations.tools.registry``).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q


class McpServer(models.Model):
    class Transport(models.TextChoices):
        BUILTIN = "builtin", "Built-in (calculator, time, search of the user's conversations)"
        STDIO = "stdio", "Command (stdio)"
        HTTP = "http", "Streamable HTTP URL"

    name = models.CharField(max_length=80, unique=True)
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.STDIO)
    command = models.CharField(max_length=500, blank=True, default="", help_text="stdio: the program")
    args = models.JSONField(default=list, blank=True, help_text='stdio: its arguments, e.g. ["-m", "server"]')
    env = models.JSONField(
        default=dict, blank=True, help_text="stdio: environment variables for it (nothing else is passed)"
    )
    url = models.URLField(max_length=500, blank=True, default="", help_text="http: the endpoint")
    enabled = models.BooleanField(default=True)
    all_users = models.BooleanField(default=False, help_text="Every signed-in user may use it")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="mcp_servers")
    groups = models.ManyToManyField(Group, blank=True, related_name="mcp_servers")
    timeout_seconds = models.FloatField(default=30.0, help_text="Per tool call (and per listing)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.transport == self.Transport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio server needs a command."})
        if self.transport == self.Transport.HTTP and not self.url:
            raise ValidationError({"url": "An HTTP server needs a URL."})
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise ValidationError({"args": "A list of strings."})
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ValidationError({"env": "An object of string values."})
        if self.timeout_seconds <= 0:
            raise ValidationError({"timeout_seconds": "Must be positive."})

    @classmethod
    def usable_by(cls, user) -> models.QuerySet[McpServer]:
        """The enabled servers ``user`` may use: open to all, or granted to them or a group of theirs."""
        if user is None or not user.is_active:
            return cls.objects.none()
        allowed = Q(all_users=True) | Q(users=user) | Q(groups__in=user.groups.all())
        return cls.objects.filter(allowed, enabled=True).distinct()
