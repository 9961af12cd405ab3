"""``/v1`` tools with each family's own format (Mistral, Granite, Llama 3, gpt-oss): the
grammar lets the family's call through, the answer comes back as ``tool_calls`` (and the
thinking as ``reasoning_content``), streamed and whole alike, also when ``max_tokens`` cuts it."""

from __future__ import annotations

import json

import pytest

from tests.support.api_engine import in_process_openai_client
from tests.support.family_models import REASONING, scripted_family_model

pytestmark = pytest.mark.timeout(180)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MARKUP = (
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|tool_call|>",
    "<|python_tag|>",
    "<|channel|>",
    "<|message|>",
    '{"name"',
)


@pytest.fixture(params=["mistral", "mistral-v11", "granite3", "llama3.1", "gpt-oss"])
def family_client(request, api_user, monkeypatch):

    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(
        EngineConfig(device="cpu", num_kv_blocks=64), loaded=scripted_family_model(request.param)
    )

    client = in_process_openai_client(monkeypatch, engine, api_user)
    yield client, engine, request.param
    engine.shutdown()


async def _whole(client, engine, **fields) -> dict:
    response = await client.chat.completions.create(model=engine.model_name, **fields)
    _whole.completion_tokens = response.usage.completion_tokens
    [choice] = response.choices
    message = choice.message
    return {
        "content": message.content or "",
        "reasoning": (message.model_extra or {}).get("reasoning_content") or "",
        "calls": [(c.function.name, c.function.arguments) for c in message.tool_calls or []],
        "finish_reason": choice.finish_reason,
    }


async def _streamed(client, engine, **fields) -> dict:
    stream = await client.chat.completions.create(model=engine.model_name, stream=True, **fields)
    content, reasoning, calls, finish = "", "", {}, None
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for part in choice.delta.tool_calls or []:
                if part.index not in calls:
                    calls[part.index] = [part.function.name, ""]
                calls[part.index][1] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": [tuple(c) for c in calls.values()],
        "finish_reason": finish,
    }


async def test_family_calls_come_back_as_tool_calls(family_client):
    client, engine, family = family_client
    fields = {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "max_tokens": 120,
    }
    whole = await _whole(client, engine, **fields)
    assert whole["finish_reason"] == "tool_calls" and whole["content"] == "", whole
    assert [(n, json.loads(a)) for n, a in whole["calls"]] == [("get_weather", {"city": "Oslo"})]
    assert whole["reasoning"] == (REASONING if family == "gpt-oss" else "")
    assert await _streamed(client, engine, **fields) == whole
    # Cut by max_tokens anywhere: the same streamed or not, and no markup in the content.
    length = _whole.completion_tokens
    for max_tokens in sorted({1, 2, length // 3, length // 2, length - 4, length - 1} - {0}):
        cut = {**fields, "max_tokens": max_tokens}
        whole = await _whole(client, engine, **cut)
        assert whole["finish_reason"] == "length", (max_tokens, whole)
        assert not any(m in whole["content"] for m in MARKUP), (max_tokens, whole)
        assert await _streamed(client, engine, **cut) == whole, max_tokens
