"""Tool formats: rendering into plain messages, parsing answers, choosing a format."""

from __future__ import annotations

import json
import re

import pytest

from inference.tokenizer import Tokenizer
from inference.tools import ToolCall, new_call_id, tool_format_for
from inference.tools.formats import GenericFormat, HermesFormat, Llama3Format, template_format_name
from tests.support.fakes import smollm2_tokenizer_dir
from tests.tools.qwen_template import LLAMA31_SNIPPET, QWEN25_TEMPLATE

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def _conversation(arguments: object) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                },
                {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21°C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


@pytest.mark.smoke
def test_call_ids_have_openai_shape() -> None:
    assert re.fullmatch(r"call_[0-9a-f]{24}", new_call_id())
    assert new_call_id() != new_call_id()
    call = ToolCall.new("f", "{}")
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }


def test_hermes_render_matches_qwen25_template(hf_tokenizer) -> None:
    """Rendered to plain messages, the conversation gives exactly the text Qwen2.5's own
    template writes from the structured messages and tools."""
    hf_tokenizer.chat_template = QWEN25_TEMPLATE
    args = {"city": "Paris"}
    expected = hf_tokenizer.apply_chat_template(
        _conversation(args), tools=[WEATHER, TIME], tokenize=False, add_generation_prompt=True
    )
    fmt = tool_format_for(hf_tokenizer)
    assert fmt.name == "hermes"
    plain = fmt.render(_conversation(json.dumps(args)), [WEATHER, TIME])
    assert all(set(m) == {"role", "content"} for m in plain)
    assert Tokenizer(hf_tokenizer).apply_chat_template(plain) == expected


def test_hermes_parse_calls_and_content() -> None:
    fmt = HermesFormat()
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    )
    content, calls = fmt.parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]
    assert len({c.id for c in calls}) == 2


def test_malformed_calls_stay_content() -> None:
    fmt = HermesFormat()
    for text in [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        "no calls at all",
    ]:
        assert fmt.parse(text) == (text, [])
    # A call cut off before its closing tag (the answer ended at EOS) still counts.
    content, calls = fmt.parse('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    assert content == "" and calls[0].name == "f"


def test_render_then_parse_round_trip() -> None:
    for fmt in (HermesFormat(), GenericFormat(), Llama3Format()):
        plain = fmt.render(_conversation({"city": "Paris"}), [WEATHER])
        assistant = next(m for m in plain if m["role"] == "assistant")
        content, calls = fmt.parse(assistant["content"])
        assert content == ""
        assert [c.name for c in calls] == ["get_weather", "now"], fmt.name
        assert json.loads(calls[0].arguments) == {"city": "Paris"}


def test_generic_describes_tools_in_system_message() -> None:
    fmt = GenericFormat()
    plain = fmt.render([{"role": "user", "content": "hi"}], [WEATHER])
    assert plain[0]["role"] == "system" and "get_weather" in plain[0]["content"]
    assert fmt.trigger in plain[0]["content"]
    results = fmt.render(_conversation({"city": "Paris"}), [WEATHER])[-1]
    assert results["role"] == "user"
    assert (
        results["content"]
        == "<tool_response>\nSunny, 21°C\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
    )
    # Without tools nothing is added.
    assert fmt.render([{"role": "user", "content": "hi"}], []) == [{"role": "user", "content": "hi"}]


def test_llama3_render_and_parse() -> None:
    fmt = Llama3Format()
    plain = fmt.render(_conversation({"city": "Paris"}), [WEATHER])
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "ipython", "ipython"]
    assert plain[1]["content"].startswith("Given the following functions")
    assert plain[1]["content"].endswith("Weather in Paris and the time?")
    assert '"name": "get_weather"' in plain[1]["content"]
    content, calls = fmt.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert (
        content == ""
        and calls[0].name == "get_weather"
        and json.loads(calls[0].arguments) == {"city": "Oslo"}
    )
    assert fmt.parse('I think {"name": 3} is odd') == ('I think {"name": 3} is odd', [])


def test_call_text_matches_begin_and_end() -> None:
    """What constrained decoding produces (begin + arguments + end) parses back."""
    for fmt in (HermesFormat(), GenericFormat(), Llama3Format()):
        text = fmt.call_begin("get_weather") + '{"city": "Rome"}' + fmt.call_end
        assert text.startswith(fmt.trigger)
        _, calls = fmt.parse(text)
        assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Rome"}')]


def test_format_detection(hf_tokenizer) -> None:
    assert template_format_name(QWEN25_TEMPLATE) == "hermes"
    assert template_format_name(LLAMA31_SNIPPET) == "llama3"
    assert template_format_name("{{ messages }}") == "generic"
    assert template_format_name(None) == "generic"
    hf_tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert tool_format_for(Tokenizer(hf_tokenizer)).name == "generic"
