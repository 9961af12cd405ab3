"""IBM Granite 3.x tool calls: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]``.

Tools are described in the system message as Granite's template does by default, and
results come back in ``tool`` turns (Granite's templates write any role as
``<|start_of_role|>role<|end_of_role|>``).
"""

from __future__ import annotations

from inference.tools.base import CallFormat, dumps, function_of, json_head, render_with_system, text_of
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import Lit, Ws

_SYSTEM = (
    "You are a helpful AI assistant with access to the following tools. When a tool is required to "
    "answer the user's query, respond with <|tool_call|> followed by a JSON list of tools used. If a "
    "tool does not exist in the provided list of tools, notify the user that you do not have the "
    "ability to fulfill the request."
)


def _result(message: dict, names: dict) -> tuple[str, str]:
    return "tool", text_of(message.get("content"))


class GraniteFormat(CallFormat):
    name = "granite"
    trigger = "<|tool_call|>"
    list_open = "<|tool_call|>["
    call_end = "}"
    separator = ", "
    list_close = "]"
    markers = ("<|tool_call|>",)
    syntax = CallSyntax(
        triggers=("<|tool_call|>",),
        head=json_head((Lit("<|tool_call|>"), Ws(), Lit("["))),
        tail=(Ws(), Lit("}")),
        next_head=json_head((Ws(), Lit(","))),
        list_end=(Ws(), Lit("]")),
    )

    def call_begin(self, name: str) -> str:
        return '{"name": ' + dumps(name) + ', "arguments": '

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        listed = "\n".join(dumps({"type": "function", "function": function_of(t)}) for t in tools)
        tools_text = f"{_SYSTEM}\n\nAvailable tools:\n{listed}"
        return render_with_system(self, messages, tools, tools_text, "", _result, merge_results=False)
