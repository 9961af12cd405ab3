"""The streaming tool-call parser: whatever the chunking, the streamed content and
arguments reassemble to what parsing the whole answer gives."""

from __future__ import annotations

import json
import random

import pytest

from inference.tools.formats import GenericFormat, HermesFormat, Llama3Format
from inference.tools.streaming import ArgumentsPiece, CallStart, TextPiece, ToolCallParser


def _stream(fmt, text: str, seed: int) -> tuple[str, list[tuple[str, str]]]:
    rng = random.Random(seed)
    parser = ToolCallParser(fmt)
    events = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 6)
        events += parser.feed(text[i : i + k])
        i += k
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    calls: list[list[str]] = []
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls.append([e.name, ""])
        elif isinstance(e, ArgumentsPiece):
            calls[e.index][1] += e.text
    return content, [(n, a) for n, a in calls]


@pytest.mark.parametrize("fmt", [HermesFormat(), GenericFormat(), Llama3Format()], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", range(5))
def test_stream_matches_whole_parse(fmt, seed: int) -> None:
    args = [{"city": 'P}a"r{is', "n": [1, {"a": 2}]}, {}]
    text = "Sure <tool or {x} ok\n" + "\n".join(
        fmt.call_begin(name) + json.dumps(a) + fmt.call_end
        for name, a in zip(["weather", "now"], args, strict=True)
    )
    content, calls = _stream(fmt, text, seed)
    whole_content, whole_calls = fmt.parse(text)
    assert content.strip() == whole_content
    assert [(n, json.loads(a)) for n, a in calls] == [(c.name, json.loads(c.arguments)) for c in whole_calls]
    assert [json.loads(a) for _, a in calls] == args


def test_plain_text_passes_through_and_partial_trigger_is_flushed() -> None:
    fmt = HermesFormat()
    assert _stream(fmt, "just text, no calls <tool_c", 1) == ("just text, no calls <tool_c", [])
    # A trigger never followed by a call head is content once the answer ends.
    assert _stream(fmt, "see <tool_call> here", 2) == ("see <tool_call> here", [])
