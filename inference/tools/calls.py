"""A function call the model made, in OpenAI's terms."""

from __future__ import annotations

import secrets
from dataclasses import dataclass


def new_call_id() -> str:
    """An id in OpenAI's shape: ``call_`` and 24 hex characters."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    id: str  # "call_" + 24 hex chars
    name: str
    arguments: str  # JSON text of an object

    @classmethod
    def new(cls, name: str, arguments: str) -> ToolCall:
        return cls(new_call_id(), name, arguments)

    def to_openai(self) -> dict:
        """The ``tool_calls`` entry of an OpenAI assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
