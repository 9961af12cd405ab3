"""The chat's tool loop over the websocket, with a scripted model that calls the built-in
calculator (in the generic format) and then answers from the result: calls and results are
nodes of the message tree, and regenerate, edit, fork and export/import keep working."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from conversations.chat.fork import fork_at
from conversations.chat.tool_loop import DENIED
from conversations.chat.tree import Tree
from conversations.models import Conversation, McpServer, Message
from conversations.tools import registry
from conversations.transfer import export_json, import_bytes
from conversations.transfer.exporting import render_json
from tests.chat.conftest import Socket
from tests.support.tool_model import (
    CALL_ARGUMENTS,
    TOOL_ANSWER,
    TOOL_CALL_TEXT,
    failing_tool_model,
    scripted_tool_model,
    three_calls_tool_model,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _engine(monkeypatch, loaded):
    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(device="cpu", num_kv_blocks=128), loaded=loaded)
    prompts: list[list[int]] = []
    submit = engine.submit  # every request's way in, the chat's and stream()'s

    def recording_submit(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return submit(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "submit", recording_submit)
    from conversations.ops import engine_handle

    monkeypatch.setattr(engine_handle.slot_for(None), "engine", engine)
    return engine, prompts


@pytest.fixture
def tool_engine(monkeypatch):
    engine, prompts = _engine(monkeypatch, scripted_tool_model())
    yield engine, prompts
    engine.shutdown()


@pytest.fixture
def three_calls_engine(monkeypatch):
    engine, prompts = _engine(monkeypatch, three_calls_tool_model())
    yield engine, prompts
    engine.shutdown()


@pytest.fixture
def failing_engine(monkeypatch):
    engine, prompts = _engine(monkeypatch, failing_tool_model())
    yield engine, prompts
    engine.shutdown()


@pytest.fixture
def builtin_server(db):
    """The built-in server open to all (a flushed test database lost the migration's row)."""
    registry._listings.clear()
    server, _ = McpServer.objects.update_or_create(
        name="Built-in tools", defaults={"transport": "builtin", "all_users": True, "enabled": True}
    )
    return server


async def _setup(make_user, make_conversation, **fields):
    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(
        alice, **{"temperature": 0.0, "max_tokens": 64, "tools_enabled": True, **fields}
    )
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")
    return alice, conversation, socket


async def until_answered(socket: Socket, timeout: float = 120) -> list[dict]:
    """``finished`` messages until an answer without calls (or a failed one) ends the loop."""
    finished = []
    while True:
        message, _ = await socket.finished(timeout=timeout)
        finished.append(message)
        if message.get("role") != "tool" and (
            not message.get("tool_calls") or message["status"] != "complete"
        ):
            return finished


@sync_to_async
def thread_rows(conversation_id: int) -> list[Message]:
    return Tree.load(Conversation.objects.get(pk=conversation_id)).thread()


def assert_tool_round(rows: list[Message], result: str = "42") -> None:
    roles = [m.role for m in rows]
    assert roles[-4:] == ["user", "assistant", "tool", "assistant"], roles
    _, caller, tool, answer = rows[-4:]
    assert caller.tool_calls and caller.tool_calls[0]["name"] == "calculator"
    assert caller.finish_reason == "tool_calls" and caller.content == ""
    assert (tool.tool_name, tool.tool_call_id) == ("calculator", caller.tool_calls[0]["id"])
    assert tool.tool_arguments == caller.tool_calls[0]["arguments"]
    assert tool.content == result and tool.status == "complete" and tool.tool_duration_ms > 0
    assert answer.content == TOOL_ANSWER and answer.status == "complete"


async def test_a_call_and_its_result_are_tree_nodes_through_regenerate_edit_fork_and_export(
    tool_engine, builtin_server, make_user, make_conversation
):
    engine, prompts = tool_engine
    alice, conversation, socket = await _setup(make_user, make_conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="What is 6*7?")
    finished = await until_answered(socket)
    assert [m.get("role", "assistant") for m in finished] == ["assistant", "tool", "assistant"]
    assert finished[1]["tool"]["name"] == "calculator" and finished[1]["content"] == "42"
    rows = await thread_rows(conversation.pk)
    assert_tool_round(rows)
    assert '"calculator"' in engine.tokenizer.decode(prompts[0])  # the tools were offered
    assert "<tool_response>\n42\n</tool_response>" in engine.tokenizer.decode(prompts[1])

    # Regenerate the final answer: a sibling under the same result.
    await socket.send(type="regenerate", conversation_id=conversation.pk, message_id=rows[-1].pk)
    await until_answered(socket)
    regenerated = await thread_rows(conversation.pk)
    assert regenerated[-2].pk == rows[-2].pk and regenerated[-1].pk != rows[-1].pk
    assert regenerated[-1].content == TOOL_ANSWER

    # Edit the question: a new branch runs the loop again.
    await socket.send(type="edit", conversation_id=conversation.pk, message_id=rows[0].pk, content="And 6*7?")
    await until_answered(socket)
    edited = await thread_rows(conversation.pk)
    assert edited[0].pk != rows[0].pk
    assert_tool_round(edited)
    await socket.close()

    # Fork at the final answer: the copy keeps the call and the result.
    forked = await sync_to_async(fork_at)(alice, edited[-1].pk)
    copy = await thread_rows(forked.pk)
    assert_tool_round(copy)
    assert (
        copy[1].tool_calls == edited[1].tool_calls and copy[2].tool_duration_ms == edited[2].tool_duration_ms
    )

    # Export and import: the tool fields and the setting come back.
    data = await sync_to_async(export_json)([await Conversation.objects.aget(pk=conversation.pk)])
    assert data["conversations"][0]["tools_enabled"] is True
    result = await sync_to_async(import_bytes)(alice, render_json(data))
    imported = await Conversation.objects.aget(pk=result.conversation_ids[0])
    assert imported.tools_enabled
    assert_tool_round(await thread_rows(imported.pk))


async def test_a_failing_tool_is_an_error_result_and_the_answer_completes(
    failing_engine, builtin_server, make_user, make_conversation
):
    _, conversation, socket = await _setup(make_user, make_conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Divide by zero")
    finished = await until_answered(socket)
    tool = finished[1]
    assert tool["role"] == "tool" and tool["tool"]["is_error"] and "division by zero" in tool["content"]
    assert finished[-1]["status"] == "complete" and finished[-1]["content"] == TOOL_ANSWER
    await socket.close()


async def test_approval_waits_for_the_user_and_a_denial_is_an_error_result(
    tool_engine, builtin_server, make_user, make_conversation, monkeypatch
):
    monkeypatch.setattr("conversations.chat.tool_loop.HEARTBEAT_SECONDS", 0.2)
    _, conversation, socket = await _setup(make_user, make_conversation, tools_approval=True)
    for approved, result in ((False, DENIED), (True, "42")):
        await socket.send(type="send", conversation_id=conversation.pk, content="6*7?")
        last = await _pending_call(socket)  # the call waits, shown as pending
        touched = (await Message.objects.aget(pk=last["id"])).updated_at
        await asyncio.sleep(1.0)  # a waiting call's row is touched, never taken for orphaned
        assert (await Message.objects.aget(pk=last["id"])).updated_at > touched
        assert last["tool"]["approval"] == "pending" and last["tool"]["arguments"] == CALL_ARGUMENTS
        await socket.send(
            type="approve", conversation_id=conversation.pk, message_id=last["id"], approved=approved
        )
        finished = await until_answered(socket)
        assert finished[0]["role"] == "tool" and finished[0]["content"] == result
        assert finished[0]["tool"]["approval"] == ("approved" if approved else "denied")
        assert finished[0]["tool"]["is_error"] is not approved
        assert finished[-1]["content"] == TOOL_ANSWER
    # A call that waits for nothing: refused, the socket stays open.
    await socket.send(type="approve", conversation_id=conversation.pk, message_id=last["id"], approved=True)
    error, _ = await socket.until("error")
    assert error["code"] == "invalid"

    # Stop while a call waits: the step is stopped, the loop ends, and the user can go on from it.
    await socket.send(type="send", conversation_id=conversation.pk, content="6*7 again?")
    pending = await _pending_call(socket)
    await socket.send(type="stop", conversation_id=conversation.pk, message_id=pending["id"])
    stopped, _ = await socket.finished(pending["id"])
    assert stopped["status"] == "interrupted" and stopped["tool"]["is_error"]
    assert (await thread_rows(conversation.pk))[-1].pk == pending["id"]
    await socket.send(
        type="send", conversation_id=conversation.pk, content="Never mind.", parent_id=pending["id"]
    )
    again = await _pending_call(socket)  # the new question's call waits in turn
    await socket.send(type="stop", conversation_id=conversation.pk, message_id=again["id"])
    await socket.finished(again["id"])
    await socket.close()


async def _pending_call(socket: Socket) -> dict:
    while True:
        thread, _ = await socket.until("thread", timeout=120)
        last = thread["messages"][-1]
        if last["role"] == "tool" and last["status"] == "streaming":
            return last


@pytest.mark.parametrize("limit", ["rounds", "not_allowed"])
async def test_no_tools_past_the_round_cap_or_without_an_allowed_server(
    tool_engine, builtin_server, make_user, make_conversation, settings, limit
):
    if limit == "rounds":
        settings.CHAT_TOOL_MAX_ROUNDS = 0
    else:
        await McpServer.objects.filter(pk=builtin_server.pk).aupdate(all_users=False)
    engine, prompts = tool_engine
    _, conversation, socket = await _setup(make_user, make_conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="6*7?")
    finished = await until_answered(socket)
    assert len(finished) == 1 and finished[0]["content"] == TOOL_CALL_TEXT  # left as text
    assert "tool_calls" not in finished[0]
    assert '"calculator"' not in engine.tokenizer.decode(prompts[0])
    assert [m.role for m in await thread_rows(conversation.pk)] == ["user", "assistant"]
    await socket.close()


def test_tool_rounds_count_answers_with_calls_since_the_last_question():
    from conversations.chat.prompt_history import tool_rounds

    path = [("user", False), ("assistant", True), ("tool", False), ("assistant", True), ("tool", False)]
    assert tool_rounds(path) == (2, True)
    assert tool_rounds([*path, ("assistant", False), ("user", False)]) == (0, True)
    assert tool_rounds([("user", False), ("assistant", False)]) == (0, False)


async def test_calls_past_the_per_answer_cap_get_an_error_result_and_do_not_run(
    three_calls_engine, builtin_server, make_user, make_conversation, settings
):
    settings.CHAT_TOOL_MAX_CALLS = 1
    _, conversation, socket = await _setup(make_user, make_conversation, max_tokens=200)
    await socket.send(type="send", conversation_id=conversation.pk, content="6*7?")
    finished = await until_answered(socket)
    assert [m.get("role", "assistant") for m in finished] == [
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
    ]
    assert len(finished[0]["tool_calls"]) == 3
    refused = ("Error: not run: one answer may make at most 1 tool calls.", True)
    results = [(m["content"], m["tool"]["is_error"]) for m in finished[1:4]]
    assert results == [("42", False), refused, refused]
    rows = await thread_rows(conversation.pk)
    assert rows[-2].tool_duration_ms == 0.0 and rows[-1].content == TOOL_ANSWER
    await socket.close()


async def test_stdio_tool_processes_are_capped_per_server_process(settings):
    """Two calls at once with one process slot: one starts its server, the other is refused
    with a clear error once its timeout passes without a free slot (and starts nothing)."""
    import sys

    from conversations.tools.client import ServerSpec, call_tool

    settings.CHAT_TOOL_MAX_PROCESSES = 1
    sleeper = ServerSpec(
        "sleeper", "stdio", sys.executable, ("-c", "import time; time.sleep(30)"), timeout=1.5
    )
    results = await asyncio.gather(*(call_tool(sleeper, "nap", {}, max_chars=500) for _ in range(2)))
    texts = sorted(r.text for r in results)
    assert all(r.is_error for r in results)
    assert "did not answer within 1.5 seconds" in texts[0]
    assert "was not run: the site already runs 1 tool processes" in texts[1]
