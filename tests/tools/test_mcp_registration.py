"""Who may register which MCP server: a stdio server (a command of the host) is a superuser's
alone, and an HTTP server's URL must be under MCP_HTTP_ALLOWED_URLS, in the admin, in the
model's validation, and again before the site reaches a server."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client

from conversations.models import McpServer
from conversations.tools import registry

pytestmark = pytest.mark.django_db

ADD = "/admin/conversations/mcpserver/add/"


def form(**fields) -> dict:
    return {
        "name": "srv",
        "transport": "http",
        "enabled": "on",
        "timeout_seconds": "30",
        "args": "[]",
        "env": "{}",
        "command": "",
        "url": "",
        **fields,
    }


@pytest.fixture
def staff_client():
    """Staff with every permission on MCP servers, but not a superuser."""
    staff = User.objects.create_user("staff", password="x", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="mcpserver"))
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def root_client():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x"))
    return client


def test_staff_cannot_register_or_change_a_stdio_server(staff_client, settings):
    settings.MCP_HTTP_ALLOWED_URLS = ["https://tools.example.com/mcp"]
    McpServer.objects.filter(transport="stdio").delete()
    reply = staff_client.post(
        ADD, form(transport="stdio", command="/bin/sh", args='["-c", "id > /tmp/pwned"]')
    )
    assert reply.status_code == 200 and not McpServer.objects.filter(transport="stdio").exists()

    existing = McpServer.objects.create(name="echo", transport="stdio", command="/bin/echo")
    change = f"/admin/conversations/mcpserver/{existing.pk}/change/"
    assert b'name="command"' not in staff_client.get(change).content  # read-only for staff
    staff_client.post(change, form(name="echo", transport="stdio", command="/bin/sh", args='["-c", "id"]'))
    existing.refresh_from_db()
    assert (existing.command, existing.args) == ("/bin/echo", [])

    # Nor may an allowed HTTP server be turned into a command.
    http = McpServer.objects.create(name="web", transport="http", url="https://tools.example.com/mcp")
    staff_client.post(
        f"/admin/conversations/mcpserver/{http.pk}/change/",
        form(name="web", transport="stdio", command="/bin/sh", url="https://tools.example.com/mcp"),
    )
    http.refresh_from_db()
    assert (http.transport, http.command) == ("http", "")


def test_the_model_check_refuses_non_superusers_wherever_a_row_is_saved():
    staff = User.objects.create_user("staff2", is_staff=True)
    root = User.objects.create_superuser("root2", "r@example.com", "x")
    stdio = McpServer(name="cmd", transport="stdio", command="/bin/true")
    with pytest.raises(PermissionDenied):
        stdio.check_editor(staff, None)
    stdio.check_editor(root, None)
    builtin = McpServer(name="b", transport="builtin")
    builtin.check_editor(staff, None)
    with pytest.raises(PermissionDenied):
        builtin.check_editor(staff, stdio)  # changing a stdio row into anything


def test_a_superuser_may_register_a_stdio_server(root_client):
    root_client.post(ADD, form(name="local", transport="stdio", command="/usr/bin/mcp-tool"))
    assert McpServer.objects.get(name="local").command == "/usr/bin/mcp-tool"


def test_http_urls_must_be_under_the_allow_list(staff_client, settings):
    from conversations.models.tools import http_url_allowed

    settings.MCP_HTTP_ALLOWED_URLS = ["https://tools.example.com/mcp"]
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "https://tools.example.com.evil.test/mcp",
        "https://tools.example.com:8443/mcp",
        "https://tools.example.com/mcpx",
        "https://user@tools.example.com/mcp",
        "http://tools.example.com/mcp",
    ):
        assert not http_url_allowed(url), url
        reply = staff_client.post(ADD, form(name="x", url=url))
        assert reply.status_code == 200 and b"MCP_HTTP_ALLOWED_URLS" in reply.content, url
    assert not McpServer.objects.filter(name="x").exists()
    assert staff_client.post(ADD, form(name="ok", url="https://tools.example.com/mcp/v1")).status_code == 302
    with pytest.raises(ValidationError):
        McpServer(name="m", transport="http", url="http://127.0.0.1:6379/").full_clean()


@pytest.mark.django_db(transaction=True)
async def test_a_row_outside_the_allow_list_is_never_reached(settings, monkeypatch):
    """A row written past validation (a shell, a fixture, an older site, a narrowed list)."""
    from asgiref.sync import sync_to_async

    reached = []

    async def fake_list(spec):
        reached.append(spec.url)
        return []

    monkeypatch.setattr(registry, "list_tools", fake_list)
    registry._listings.clear()
    settings.MCP_HTTP_ALLOWED_URLS = ["https://tools.example.com/"]

    def setup():
        McpServer.objects.all().delete()
        McpServer.objects.create(
            name="in", transport="http", url="https://tools.example.com/a", all_users=True
        )
        McpServer.objects.create(name="out", transport="http", url="http://10.0.0.1/", all_users=True)
        return User.objects.create_user("reader")

    user = await sync_to_async(setup)()
    await registry.toolset_for(user.pk)
    assert reached == ["https://tools.example.com/a"]
