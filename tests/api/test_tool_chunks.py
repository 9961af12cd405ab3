"""Stream chunks of a tool-calling answer: OpenAI's incremental tool_calls deltas."""

from __future__ import annotations

import json

from conversations.api.tool_calls import ToolPlan
from inference.tools.formats import GenericFormat, Llama3Format


def _chunks(plan: ToolPlan, text: str, size: int) -> list[dict]:
    out = []
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    for piece in pieces:
        for choices in plan.rewrite_chunk(
            [{"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}]
        ):
            out += choices
    for choices in plan.rewrite_chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]):
        out += choices
    return out


def test_two_calls_stream_in_openai_shape() -> None:
    for fmt in (GenericFormat(), Llama3Format()):
        text = "Checking.\n" + "\n".join(
            fmt.call_begin(name) + json.dumps(args) + fmt.call_end
            for name, args in [("get_weather", {"city": "Oslo"}), ("now", {"zone": "UTC"})]
        )
        plan = ToolPlan(fmt, [{"type": "function", "function": {"name": "x"}}], "auto")
        chunks = _chunks(plan, text, 3)
        content = "".join(c["delta"].get("content") or "" for c in chunks)
        assert content.strip() == "Checking."
        calls: dict[int, dict] = {}
        for c in chunks:
            for part in c["delta"].get("tool_calls", []):
                if part["index"] not in calls:
                    assert part["type"] == "function" and part["id"].startswith("call_")
                    assert part["function"]["arguments"] == ""
                    calls[part["index"]] = {"name": part["function"]["name"], "arguments": ""}
                else:
                    assert set(part) == {"index", "function"} and set(part["function"]) == {"arguments"}
                    calls[part["index"]]["arguments"] += part["function"]["arguments"]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            ("get_weather", {"city": "Oslo"}),
            ("now", {"zone": "UTC"}),
        ]
        assert chunks[-1]["finish_reason"] == "tool_calls" and chunks[-1]["delta"] == {}
        assert plan.finish_reason("stop") == "tool_calls"  # what the usage log records
        assert all(c["finish_reason"] is None for c in chunks[:-1])


def test_plain_answers_pass_unchanged_and_end_with_stop() -> None:
    plan = ToolPlan(GenericFormat(), [{"type": "function", "function": {"name": "x"}}], "auto")
    chunks = _chunks(plan, "Just words <tool", 4)
    assert "".join(c["delta"].get("content", "") for c in chunks) == "Just words <tool"
    assert chunks[-1]["finish_reason"] == "stop"
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]
    }
    assert plan.finish_reason("stop") == "stop"
    assert plan.rewrite_body(body)["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "finish_reason": "stop",
    }
