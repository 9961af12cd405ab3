"""``/v1/chat/completions`` with gpt-oss: earlier ``tool_calls`` and ``tool`` messages reach the
prompt as the family's own template writes them from the request's messages and tools."""

from __future__ import annotations

import json

import pytest

from tests.support.api_engine import in_process_openai_client
from tests.support.family_models import scripted_family_model

pytestmark = pytest.mark.timeout(180)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "assistant", "content": "Sunny, 21 C."},
    {"role": "user", "content": "And in Bergen?"},
]


@pytest.fixture
def gpt_oss_client(api_user, monkeypatch):

    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(
        EngineConfig(device="cpu", num_kv_blocks=64), loaded=scripted_family_model("gpt-oss")
    )
    client = in_process_openai_client(monkeypatch, engine, api_user)
    yield client, engine
    engine.shutdown()


async def test_earlier_calls_and_results_render_as_the_template_writes_them(gpt_oss_client, monkeypatch):
    client, engine = gpt_oss_client
    tokenizer = engine.tokenizer
    prompts: list[list[int]] = []
    encode_chat = tokenizer.encode_chat

    def recording(*args, **kwargs):
        prompts.append(encode_chat(*args, **kwargs))
        return prompts[-1]

    monkeypatch.setattr(tokenizer, "encode_chat", recording)
    await client.chat.completions.create(
        model=engine.model_name, messages=MESSAGES, tools=[WEATHER], max_tokens=8
    )
    native = [dict(m) for m in MESSAGES]
    native[2] = {
        "role": "assistant",
        "tool_calls": [
            {
                **CALL,
                "function": {"name": "get_weather", "arguments": json.loads(CALL["function"]["arguments"])},
            }
        ],
    }
    expected = tokenizer.hf.apply_chat_template(
        native, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny, 21 C"' in expected
    )
    assert tokenizer.decode(prompts[-1], skip_special_tokens=False) == expected
