"""Mistral tool calls, in the two shapes Mistral's templates write:

- ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers: Mistral 7B v0.3,
  Mixtral 8x22B, Mistral Nemo, Small 3.0/3.1);
- ``[TOOL_CALLS]name[ARGS]{...}`` once per call (v11 and later: Small 3.2, Magistral,
  Devstral), chosen when the template writes ``[ARGS]``.

Tools go in ``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``, results in ``[TOOL_RESULTS]...
[/TOOL_RESULTS]``. Mistral's templates accept only user and assistant turns after the system
message, strictly alternating, so both are written into the system and user messages.
"""

from __future__ import annotations

from inference.tools.base import (
    ARGS_OBJECT,
    CallFormat,
    dumps,
    function_of,
    json_head,
    render_with_system,
    text_of,
)
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import BareName, Lit, Ws


def _result(message: dict, names: dict) -> tuple[str, str]:
    return "user", "[TOOL_RESULTS]" + dumps({"content": text_of(message.get("content"))}) + "[/TOOL_RESULTS]"


class MistralFormat(CallFormat):
    name = "mistral"
    trigger = "[TOOL_CALLS]"
    list_open = "[TOOL_CALLS]["
    call_end = "}"
    separator = ", "
    list_close = "]"
    markers = ("[TOOL_CALLS]", "[ARGS]")
    syntax = CallSyntax(
        triggers=("[TOOL_CALLS]",),
        head=json_head((Lit("[TOOL_CALLS]"), Ws(), Lit("["))),
        tail=(Ws(), Lit("}")),
        next_head=json_head((Ws(), Lit(","))),
        list_end=(Ws(), Lit("]")),
    )

    def call_begin(self, name: str) -> str:
        return '{"name": ' + dumps(name) + ', "arguments": '

    @staticmethod
    def tools_text(tools: list[dict]) -> str:
        listed = dumps([{"type": "function", "function": function_of(t)} for t in tools])
        return f"[AVAILABLE_TOOLS]{listed}[/AVAILABLE_TOOLS]"

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        out: list[dict] = []
        for message in render_with_system(self, messages, tools, self.tools_text(tools), "", _result):
            if out and message["role"] == "user" and out[-1]["role"] == "user":
                # Results then a question: one user turn, as the template wants them alternating.
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + message["content"]}
            else:
                out.append(message)
        return out


class MistralArgsFormat(MistralFormat):
    """v11 and later: ``[TOOL_CALLS]name[ARGS]{...}``, one marker per call."""

    name = "mistral_args"
    list_open = ""
    call_end = ""
    separator = ""
    list_close = ""
    syntax = CallSyntax(
        triggers=("[TOOL_CALLS]",),
        head=(Lit("[TOOL_CALLS]"), Ws(), BareName(stops=("[",)), Lit("[ARGS]"), Ws(), ARGS_OBJECT),
    )

    def call_begin(self, name: str) -> str:
        return f"[TOOL_CALLS]{name}[ARGS]"
