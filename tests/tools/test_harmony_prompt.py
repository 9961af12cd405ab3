"""gpt-oss's prompt for a conversation with earlier calls, results and reasoning is the text
its own template writes from the OpenAI-shaped messages and tools, byte for byte."""

from __future__ import annotations

import json

import pytest

from conversations.chat.prompts import ToolPrompt, build_prompt
from inference.tokenizer import Tokenizer
from inference.tools import tool_format_for
from tests.support.chat_templates import GPT_OSS, HARMONY_SPECIAL_TOKENS
from tests.support.fakes import smollm2_tokenizer_dir

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {}}}
TOOLS = [WEATHER, NOW]
ARGUMENTS = {"city": "Oslo", "unit": "celsius"}
REASONING = "The user wants the weather; call get_weather."

# The chat's history items (``Message`` rows): an answer's calls, reasoning and a result.
HISTORY = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning": REASONING,
        "tool_calls": [{"id": "call_1", "name": "get_weather", "arguments": json.dumps(ARGUMENTS)}],
    },
    {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1", "tool_name": "get_weather"},
    {"role": "assistant", "content": "It is sunny in Oslo, 21 C."},
    {"role": "user", "content": "And tomorrow?"},
]

# The same conversation as transformers' ``apply_chat_template`` takes it.
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "thinking": REASONING,
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}],
    },
    {"role": "tool", "content": "Sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny in Oslo, 21 C."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    hf.add_special_tokens({"additional_special_tokens": HARMONY_SPECIAL_TOKENS})
    hf.chat_template = GPT_OSS
    return Tokenizer(hf)


@pytest.mark.parametrize("length", [len(HISTORY), 3])  # after the final answer; a pending call
def test_prompt_is_the_templates_own_render(tokenizer: Tokenizer, length: int) -> None:
    expected = tokenizer.hf.apply_chat_template(
        MESSAGES[: length + 1], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    fmt = tool_format_for(tokenizer)
    assert fmt.name == "harmony"
    plan = build_prompt(tokenizer, "Be brief.", HISTORY[:length], 2048, 64, tools=ToolPrompt(fmt, TOOLS))
    assert tokenizer.decode(plan.token_ids, skip_special_tokens=False) == expected
    assert plan.token_ids == tokenizer.encode(expected)
    # The template's own text, not a stand-in: tool declarations, the call, its result.
    assert "type get_weather = (_: {\n// The city's name.\ncity: string,\n" in expected
    assert (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"'
        in expected
    )
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny, 21 C"' in expected
    )
    # The reasoning before a call goes back to the model until a final answer follows it.
    assert (REASONING in expected) == (length == 3)
