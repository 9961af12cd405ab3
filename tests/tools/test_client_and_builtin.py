"""The MCP client's limits, the built-in server's tools, and who may use which server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from mcp import Client

from conversations.models import Conversation, McpServer, Message
from conversations.tools import registry
from conversations.tools.builtin_server import build_server
from conversations.tools.calculator import CalculatorError, evaluate
from conversations.tools.client import ServerSpec, ToolInfo, call_tool, cap_output, list_tools


def test_calculator_computes_arithmetic():
    assert evaluate("2 * (3 + 4) ** 2") == 98
    assert evaluate("7 / 2") == 3.5
    assert evaluate("-3 + sqrt(16) + max(1, 2)") == 3
    assert evaluate("2^10") == 1024


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "().__class__", "open('x')", "x", "9 ** 99999", "10 ** 400", "1/0", "", "a" * 600],
)
def test_calculator_refuses_anything_else(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_cap_output_cuts_and_says_so():
    assert cap_output("abc", 5) == "abc"
    capped = cap_output("x" * 50, 10)
    assert capped.startswith("x" * 10) and "cut at 10 of 50" in capped


@pytest.mark.smoke
async def test_builtin_server_calculator_and_time():
    async with Client(build_server(None)) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"calculator", "current_time", "search_conversations"}
        result = await client.call_tool("calculator", {"expression": "6*7"})
        assert not result.is_error and result.content[0].text == "42"
        bad = await client.call_tool("calculator", {"expression": "__import__('os')"})
        assert bad.is_error and "not allowed" in bad.content[0].text
        now = await client.call_tool("current_time", {"timezone": "Europe/Paris"})
        assert not now.is_error and now.content[0].text[:4].isdigit()
        unknown = await client.call_tool("current_time", {"timezone": "Mars/Olympus"})
        assert unknown.is_error


@pytest.mark.django_db(transaction=True)
async def test_builtin_search_sees_only_the_users_own_conversations():
    alice = await sync_to_async(User.objects.create_user)("alice", password="x")
    bob = await sync_to_async(User.objects.create_user)("bob", password="x")

    def seed():
        for owner, text in ((alice, "my zebra notes"), (bob, "bob's secret zebra plan")):
            conversation = Conversation.objects.create(owner=owner, title=f"{owner.username} chat")
            Message.objects.create(conversation=conversation, role="user", content=text)

    await sync_to_async(seed)()
    async with Client(build_server(alice.pk)) as client:
        result = await client.call_tool("search_conversations", {"query": "zebra"})
    hits = json.loads(result.content[0].text)
    assert [h["title"] for h in hits] == ["alice chat"]
    assert "secret" not in result.content[0].text
    async with Client(build_server(None)) as client:  # started without a user: refuses
        assert (await client.call_tool("search_conversations", {"query": "zebra"})).is_error


def _test_server(timeout: float) -> ServerSpec:
    env = (("PYTHONPATH", os.environ.get("PYTHONPATH", os.getcwd())),)
    return ServerSpec(
        "test", "stdio", sys.executable, ("-m", "tests.support.mcp_servers"), env, timeout=timeout
    )


async def test_stdio_call_times_out_with_an_error_result():
    started = time.monotonic()
    result = await call_tool(_test_server(timeout=6.0), "slow", {"seconds": 60}, max_chars=1000)
    assert result.is_error and "did not answer within 6 seconds" in result.text
    assert time.monotonic() - started < 30


async def test_stdio_output_is_capped_and_crashes_are_error_results():
    spec = _test_server(timeout=60.0)
    result = await call_tool(spec, "big", {"size": 20_000}, max_chars=1000)
    assert not result.is_error and result.text.startswith("x" * 1000)
    assert "cut at 1000 of 20000" in result.text and len(result.text) < 1100
    crashed = await call_tool(spec, "boom", {}, max_chars=1000)
    assert crashed.is_error and "boom" in crashed.text


async def test_a_streamable_http_server_is_listed_and_called():
    import subprocess

    from tests.live_site import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_servers", "--http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    spec = ServerSpec("http-test", "http", url=f"http://127.0.0.1:{port}/mcp", timeout=20.0)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                tools = await list_tools(spec)
                break
            except registry.ToolServerError:
                assert time.monotonic() < deadline, "the HTTP server did not come up"
                await asyncio.sleep(0.5)
        assert {t.name for t in tools} == {"slow", "big", "boom"}
        result = await call_tool(spec, "big", {"size": 3}, max_chars=100)
        assert (result.text, result.is_error) == ("xxx", False)
    finally:
        process.terminate()
        process.wait(timeout=15)


async def test_unreachable_servers_give_error_results():
    missing = ServerSpec("gone", "stdio", "/nonexistent/mcp-server", timeout=5.0)
    result = await call_tool(missing, "anything", {}, max_chars=1000)
    assert result.is_error and result.text.startswith("Error:")
    refused = ServerSpec("closed", "http", url="http://127.0.0.1:9/mcp", timeout=5.0)
    assert (await call_tool(refused, "anything", {}, max_chars=1000)).is_error
    with pytest.raises(registry.ToolServerError):
        await list_tools(missing)


@pytest.mark.django_db(transaction=True)
async def test_a_user_gets_only_the_tools_of_servers_allowed_to_them(monkeypatch, settings):
    settings.MCP_HTTP_ALLOWED_URLS = ["http://x.test/"]

    async def fake_list(spec):
        return [ToolInfo(name=f"{spec.name}_tool", description="", parameters={"type": "object"})]

    monkeypatch.setattr(registry, "list_tools", fake_list)
    registry._listings.clear()

    def setup():
        McpServer.objects.all().delete()
        team = Group.objects.create(name="team")
        member = User.objects.create_user("member", password="x")
        member.groups.add(team)
        chosen = User.objects.create_user("chosen", password="x")
        outsider = User.objects.create_user("outsider", password="x")
        McpServer.objects.create(name="open", transport="http", url="http://x.test/", all_users=True)
        McpServer.objects.create(
            name="off", transport="http", url="http://x.test/", all_users=True, enabled=False
        )
        McpServer.objects.create(name="teamonly", transport="http", url="http://x.test/").groups.add(team)
        McpServer.objects.create(name="personal", transport="http", url="http://x.test/").users.add(chosen)
        return member, chosen, outsider

    member, chosen, outsider = await sync_to_async(setup)()

    async def names(user):
        return {t["function"]["name"] for t in (await registry.toolset_for(user.pk)).tools}

    assert await names(member) == {"open_tool", "teamonly_tool"}
    assert await names(chosen) == {"open_tool", "personal_tool"}
    assert await names(outsider) == {"open_tool"}
    assert await registry.route(outsider.pk, "teamonly_tool") is None
    assert (await registry.route(member.pk, "teamonly_tool"))[1] == "teamonly_tool"
