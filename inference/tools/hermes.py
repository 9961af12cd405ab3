"""Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Tools are listed in the system message inside ``<tools>``, results come back in a user turn
inside ``<tool_response>`` tags: the text Qwen's own templates write, so prompts match the
ones the model was trained on. ``GenericFormat`` uses the same call syntax for templates
without tool support (SmolLM2), with the tools and the syntax explained in the system
message (docs/interfaces.md, "Tool calls").
"""

from __future__ import annotations

from inference.tools.base import CallFormat, dumps, function_of, json_head, render_with_system, text_of
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import Lit, Ws


def _result(message: dict, names: dict) -> tuple[str, str]:
    return "user", f"<tool_response>\n{text_of(message.get('content'))}\n</tool_response>"


class HermesFormat(CallFormat):
    name = "hermes"
    trigger = "<tool_call>"
    call_end = "}\n</tool_call>"
    separator = "\n"
    markers = ("<tool_call>", "</tool_call>")
    syntax = CallSyntax(
        triggers=("<tool_call>",),
        head=json_head((Lit("<tool_call>"),)),
        tail=(Ws(), Lit("}"), Ws(), Lit("</tool_call>")),
    )
    _DEFAULT_SYSTEM = "You are a helpful assistant."

    def call_begin(self, name: str) -> str:
        return '<tool_call>\n{"name": ' + dumps(name) + ', "arguments": '

    def tools_text(self, tools: list[dict]) -> str:
        lines = "\n".join(dumps({"type": "function", "function": function_of(t)}) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        return render_with_system(
            self, messages, tools, self.tools_text(tools), self._DEFAULT_SYSTEM, _result
        )


class GenericFormat(HermesFormat):
    """For templates without tool support: hermes call syntax, explained in the system message."""

    name = "generic"

    def tools_text(self, tools: list[dict]) -> str:
        lines = "\n".join(dumps(function_of(t)) for t in tools)
        return (
            "# Tools\n\nYou can call the functions below. Each is given as a JSON object with its "
            "name, description and a JSON schema of its parameters:\n<tools>\n"
            f"{lines}\n</tools>\n\nTo call a function, answer with one block per call, exactly like "
            'this:\n<tool_call>\n{"name": "<function name>", "arguments": <arguments as a JSON object>}\n'
            "</tool_call>\nWrite nothing after the last block. Each result comes back in a user "
            "message inside <tool_response></tool_response> tags."
        )
