"""The chat's tool loop with gpt-oss's harmony format: the answer's analysis channel goes to
the reasoning panel (``Message.reasoning``), its call to the built-in calculator runs as a
tool node, and the result goes back to the model."""

from __future__ import annotations

import pytest

from tests.chat.test_tool_loop import _engine, _setup, builtin_server, thread_rows, until_answered  # noqa: F401
from tests.support.family_models import REASONING, scripted_family_model

pytestmark = pytest.mark.django_db(transaction=True)

HARMONY_CALCULATOR = (
    f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>commentary "
    '<|constrain|>json to=functions.calculator<|message|>{"expression": "6*7"}<|call|>'
)


@pytest.fixture
def harmony_engine(monkeypatch, settings):
    # One round of calls: the answer after the result is offered no tools (the scripted
    # model calls again, and that call stays text), which ends the loop.
    settings.CHAT_TOOL_MAX_ROUNDS = 1
    engine, prompts = _engine(monkeypatch, scripted_family_model("gpt-oss", HARMONY_CALCULATOR))
    yield engine, prompts
    engine.shutdown()


@pytest.mark.usefixtures("builtin_server")
async def test_harmony_reasoning_and_call_in_the_chat(harmony_engine, make_user, make_conversation):
    engine, prompts = harmony_engine
    _, conversation, socket = await _setup(make_user, make_conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="What is 6*7?")
    finished = await until_answered(socket)
    assert [m.get("role", "assistant") for m in finished] == ["assistant", "tool", "assistant"]
    rows = await thread_rows(conversation.pk)
    _, caller, tool, _answer = rows[-4:]
    assert caller.reasoning == REASONING and caller.content == ""
    assert [c["name"] for c in caller.tool_calls] == ["calculator"] and caller.finish_reason == "tool_calls"
    assert tool.content == "42" and tool.tool_call_id == caller.tool_calls[0]["id"]
    assert "namespace functions" in engine.tokenizer.decode(prompts[0], skip_special_tokens=False)
    # The template writes the call (with the reasoning before it) and the result its own way.
    second = engine.tokenizer.decode(prompts[1], skip_special_tokens=False)
    assert f"<|start|>assistant<|channel|>analysis<|message|>{REASONING}<|end|>" in second
    assert "<|start|>assistant to=functions.calculator<|channel|>commentary json<|message|>" in second
    assert '<|start|>functions.calculator to=assistant<|channel|>commentary<|message|>"42"<|end|>' in second
    await socket.close()
