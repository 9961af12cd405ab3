"""Each family end to end through the engine: its template renders the tools, the model's
answer streams through the detokenizer (marker tokens kept), the reasoning splitter and the
family's tool parser, and gives the reasoning apart and the call, streamed or whole alike."""

from __future__ import annotations

import json

import pytest

from inference import EngineConfig, LLMEngine, SamplingParams
from inference.tools import tool_format_for
from tests.support.chat_templates import FAMILY_TEMPLATES
from tests.support.family_models import ARGUMENTS, HAS_REASONING, REASONING, scripted_family_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("family", FAMILY_TEMPLATES)
def test_family_answer_gives_reasoning_and_call(family: str) -> None:
    loaded = scripted_family_model(family)
    engine = LLMEngine(EngineConfig(device="cpu", num_kv_blocks=32), loaded=loaded)
    tokenizer = engine.tokenizer
    fmt = tool_format_for(tokenizer)
    assert fmt.name == FAMILY_TEMPLATES[family][1]
    # The tools, an earlier call and its result go through the family's own template.
    prompt = tokenizer.encode_chat(fmt.render(HISTORY, TOOLS), tools=TOOLS if fmt.native else None)
    rendered = tokenizer.decode(prompt, skip_special_tokens=False)
    assert "get_weather" in rendered and "Sunny, 21 C" in rendered and '"Oslo"' in rendered
    request = engine.add_request(
        prompt, SamplingParams(temperature=0, max_tokens=120, separate_reasoning=True)
    )
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    output = engine.request_output(request)
    text = "".join(d.text for d in deltas)
    assert text == output.text
    assert "".join(d.reasoning for d in deltas) == (REASONING if family in HAS_REASONING else "")
    parsed = fmt.parse_answer(text)
    assert parsed.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]
    assert output.finish_reason == "stop"
