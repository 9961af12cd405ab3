"""One streamed chat choice's content deltas -> OpenAI's ``content`` / ``tool_calls`` deltas."""

from __future__ import annotations

from typing import Any


class ToolCallStream:
    def __init__(self, tool_format: Any) -> None:
        from inference.tools.streaming import ToolCallParser

        self.parser = ToolCallParser(tool_format)

    @property
    def num_calls(self) -> int:
        return self.parser.num_calls

    def feed(self, text: str) -> list[dict[str, Any]]:
        return [_delta(e) for e in self.parser.feed(text)]

    @property
    def repeated(self) -> bool:
        return self.parser.repeated

    def finish(self, cut: bool = False) -> list[dict[str, Any]]:
        return [_delta(e) for e in self.parser.finish(cut)]


def _delta(event: Any) -> dict[str, Any]:
    from inference.tools.streaming import CallStart, TextPiece

    if isinstance(event, TextPiece):
        return {"content": event.text}
    if isinstance(event, CallStart):
        call = {"index": event.index, "id": event.id, "type": "function"}
        return {"tool_calls": [{**call, "function": {"name": event.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
