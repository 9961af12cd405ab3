"""Each family's tool-call format, picked from its template's markers: streamed and whole
answers agree (content, calls, finish reason) however the answer is split and wherever
``max_tokens`` cuts it; a repeated call ends the list; the parse is linear."""

from __future__ import annotations

import gc
import json
import random
import time

import pytest

from conversations.api.tool_calls import ToolPlan
from inference.tools.formats import FORMATS, format_named, template_format_name
from tests.support.chat_templates import FAMILY_TEMPLATES

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]
CALLS = [
    {
        "function": {
            "name": "get_weather",
            "arguments": json.dumps({"city": 'P}a"r{is <tool_call>', "n": [1, {}]}),
        }
    },
    {"function": {"name": "now", "arguments": "{}"}},
]
MARKUP = (
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|tool_call|>",
    "<|python_tag|>",
    "<|channel|>",
)


def _answer(fmt, calls=CALLS) -> str:
    calls = calls[: fmt.max_calls or len(calls)]
    return "Let me check.\n" + fmt.calls_text(calls)


def _body(plan: ToolPlan, text: str, reason: str) -> dict:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}]
    }
    choice = plan.rewrite_body(body)["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    return {"content": message["content"] or "", "calls": calls, "finish_reason": choice["finish_reason"]}


def _stream(plan: ToolPlan, text: str, reason: str, rng: random.Random) -> dict:
    chunks = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 7)
        delta = {"content": text[i : i + k]}
        chunks += [
            c for cs in plan.rewrite_chunk([{"index": 0, "delta": delta, "finish_reason": None}]) for c in cs
        ]
        i += k
    end = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}]
    chunks += [c for cs in plan.rewrite_chunk(end) for c in cs]
    content = "".join(c["delta"].get("content") or "" for c in chunks)
    calls: dict[int, list[str]] = {}
    for c in chunks:
        for part in c["delta"].get("tool_calls", []):
            if "id" in part:
                calls[part["index"]] = [part["function"]["name"], ""]
            calls[part["index"]][1] += part["function"]["arguments"]
    assert all(c["finish_reason"] is None for c in chunks[:-1])
    return {
        "content": content,
        "calls": [tuple(c) for c in calls.values()],
        "finish_reason": chunks[-1]["finish_reason"],
    }


def _plan(fmt) -> ToolPlan:
    return ToolPlan(fmt, TOOLS, "auto")


@pytest.mark.parametrize("family", FAMILY_TEMPLATES)
def test_format_follows_the_template_markers(family: str) -> None:
    template, name, _ = FAMILY_TEMPLATES[family]
    assert template_format_name(template) == name


@pytest.mark.parametrize("name", FORMATS)
def test_whole_answer_gives_the_calls(name: str) -> None:
    fmt = format_named(name)
    got = _body(_plan(fmt), _answer(fmt), "stop")
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in CALLS[: fmt.max_calls or 2]]
    assert got == {"content": "Let me check.", "calls": expected, "finish_reason": "tool_calls"}


@pytest.mark.parametrize("name", FORMATS)
def test_streamed_and_whole_agree_at_every_cut(name: str) -> None:
    fmt = format_named(name)
    text = _answer(fmt)
    rng = random.Random(name)
    for end in range(1, len(text) + 1):
        for reason in ("stop", "length"):
            whole = _body(_plan(fmt), text[:end], reason)
            streamed = _stream(_plan(fmt), text[:end], reason, rng)
            assert streamed == whole, (end, reason)
            if reason == "length":
                # Markup never reaches the content of a cut answer: the text before the
                # calls, or the start of it.
                assert "Let me check.".startswith(whole["content"].rstrip()), (end, whole)
                assert not any(m in whole["content"] for m in MARKUP)


@pytest.mark.parametrize("name", FORMATS)
def test_cut_in_the_arguments_is_a_call_with_what_it_got(name: str) -> None:
    fmt = format_named(name)
    text = "Let me check.\n" + fmt.list_open + fmt.call_begin("get_weather") + '{"city": "Os'
    got = _body(_plan(fmt), text, "length")
    assert got == {
        "content": "Let me check.",
        "calls": [("get_weather", '{"city": "Os')],
        "finish_reason": "length",
    }
    cut_in_head = "Let me check.\n" + (fmt.list_open + fmt.call_begin("get_weather"))[:-3]
    assert _body(_plan(fmt), cut_in_head, "length") == {
        "content": "Let me check.",
        "calls": [],
        "finish_reason": "length",
    }
    assert _stream(_plan(fmt), cut_in_head, "length", random.Random(0))["content"] == "Let me check."


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "harmony"])
def test_a_repeated_call_ends_the_list(name: str) -> None:
    fmt = format_named(name)
    first, other = CALLS
    text = fmt.calls_text([first, other, first, other, first])
    for cut in (len(text), len(text) - 3):
        for reason in ("stop", "length"):
            whole = _body(_plan(fmt), text[:cut], reason)
            assert whole["calls"] == [
                (c["function"]["name"], c["function"]["arguments"]) for c in (first, other)
            ]
            assert whole["finish_reason"] == "tool_calls" and whole["content"] == ""
            assert _stream(_plan(fmt), text[:cut], reason, random.Random(cut)) == whole
    # The same function with other arguments is a call of its own.
    again = {"function": {"name": "get_weather", "arguments": '{"city": "P}a"}'}}
    whole = _body(_plan(fmt), fmt.calls_text([first, again]), "stop")
    assert len(whole["calls"]) == 2


def test_plain_text_with_trigger_lookalikes_stays_content() -> None:
    for name in FORMATS:
        fmt = format_named(name)
        for text in [
            "see <tool_call> here",
            'I think {"name": 3} is odd',
            "[TOOL_CALLS] nothing",
            "x <|tool_call|>y",
        ]:
            assert _body(_plan(fmt), text, "stop") == {"content": text, "calls": [], "finish_reason": "stop"}


def _parse_seconds(fmt, n: int) -> float:
    texts = [
        fmt.trigger + " " * n + "x",
        "<tool_call>\n{" + " " * n + "x",
        fmt.list_open + fmt.call_begin("f") + '{"a": ' + " " * n,
        ("<tool_call>" + " " * 50) * (n // 60),
    ]
    gc.disable()
    try:
        start = time.perf_counter()
        for text in texts:
            fmt.parse(text)
        return time.perf_counter() - start
    finally:
        gc.enable()


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_parse_is_linear_in_runs_of_whitespace(name: str) -> None:
    """Ten times the whitespace takes ten to thirty times as long (memory effects), not a
    hundred as a quadratic parse does.
    The best of a few runs each, so that other work on the machine does not decide."""
    fmt = format_named(name)
    _parse_seconds(fmt, 1_000)  # warm up
    small = min(_parse_seconds(fmt, 20_000) for _ in range(5))
    large = min(_parse_seconds(fmt, 200_000) for _ in range(3))
    assert large / small < 50, (small, large)
