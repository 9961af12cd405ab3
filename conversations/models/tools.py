"""MCP servers an admin registers, and who may use each one.

A server is a stdio command (started per use, speaking MCP on its stdin/stdout), a
streamable HTTP URL, or the site's own built-in server (``conversations.tools.builtin_server``,
started as ``python -m`` of that module). The chat offers a conversation the tools of every
enabled server its owner may use (``conversations.tools.registry``).

Who may register what: a stdio server runs a command of the host with its arguments and
environment, so only a superuser may create one, change one, or turn another server into
one (:meth:`McpServer.check_editor`; staff with the change permission may not). An HTTP
server's URL must fall under ``MCP_HTTP_ALLOWED_URLS`` (:func:`http_url_allowed`), checked
when a row is validated and again before each use, so no row written by any path makes the
site fetch another URL.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import Q

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parts(url: str) -> tuple[str, str, int, str] | None:
    """``(scheme, host, port, path)`` of an http(s) URL without credentials, else None."""
    try:
        split = urlsplit(url.strip())
        port = split.port
    except ValueError:
        return None
    scheme = split.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not split.hostname or split.username or split.password:
        return None
    return scheme, split.hostname.lower(), port or _DEFAULT_PORTS[scheme], split.path or "/"


def http_url_allowed(url: str) -> bool:
    """Whether ``url`` falls under one of ``MCP_HTTP_ALLOWED_URLS`` (URL prefixes): the same
    scheme, host and port, and a path at or below the prefix's (at a ``/``). Empty: none."""
    candidate = _parts(url)
    if candidate is None:
        return False
    for allowed in getattr(settings, "MCP_HTTP_ALLOWED_URLS", ()):
        prefix = _parts(allowed)
        if prefix is None or prefix[:3] != candidate[:3]:
            continue
        base, path = prefix[3], candidate[3]
        if path == base or path.startswith(base if base.endswith("/") else base + "/"):
            return True
    return False


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
        if self.transport == self.Transport.HTTP and not http_url_allowed(self.url):
            raise ValidationError(
                {"url": "This URL is not under MCP_HTTP_ALLOWED_URLS, the servers this site may reach."}
            )
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise ValidationError({"args": "A list of strings."})
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ValidationError({"env": "An object of string values."})
        if self.timeout_seconds <= 0:
            raise ValidationError({"timeout_seconds": "Must be positive."})

    def check_editor(self, user, before: McpServer | None) -> None:
        """Raise ``PermissionDenied`` unless ``user`` may save this row, ``before`` being the
        stored row it changes (None for a new one): a stdio server, before or after, is a
        superuser's alone, since it runs a command of the host."""
        stdio = self.Transport.STDIO
        if (self.transport == stdio or (before is not None and before.transport == stdio)) and not (
            user is not None and user.is_active and user.is_superuser
        ):
            raise PermissionDenied("Only a superuser may register or change a stdio (command) MCP server.")

    def usable_now(self) -> bool:
        """Whether the site may reach this row as it stands: an HTTP URL still allowed."""
        return self.transport != self.Transport.HTTP or http_url_allowed(self.url)

    @classmethod
    def usable_by(cls, user) -> models.QuerySet[McpServer]:
        """The enabled servers ``user`` may use: open to all, or granted to them or a group of theirs."""
        if user is None or not user.is_active:
            return cls.objects.none()
        allowed = Q(all_users=True) | Q(users=user) | Q(groups__in=user.groups.all())
        return cls.objects.filter(allowed, enabled=True).distinct()
