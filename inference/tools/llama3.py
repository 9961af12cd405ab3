"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: ``{"name": ..., "parameters": {...}}``, maybe after
``<|python_tag|>``, several joined by ``; ``. Tools are described in the first user message
and results come back in an ``ipython`` turn, as Llama's own template writes them by default.
"""

from __future__ import annotations

import json

from inference.tools.base import CallFormat, dumps, function_of, json_head, text_of
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import Lit, Ws


class Llama3Format(CallFormat):
    name = "llama3"
    trigger = '{"name"'
    call_end = "}"
    separator = "; "
    markers = ("<|python_tag|>",)
    syntax = CallSyntax(
        triggers=('{"name"', '{ "name"', "<|python_tag|>"),
        head=json_head((Lit("<|python_tag|>", optional=True),), ("parameters", "arguments")),
        tail=(Ws(), Lit("}"), Ws(), Lit(";", optional=True)),
    )

    def call_begin(self, name: str) -> str:
        return '{"name": ' + dumps(name) + ', "parameters": '

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        out: list[dict] = []
        pending_tools = bool(tools)
        for message in messages:
            role = message.get("role")
            content = text_of(message.get("content"))
            if role == "tool":
                out.append({"role": "ipython", "content": content})
            elif role == "assistant" and message.get("tool_calls"):
                out.append({"role": "assistant", "content": self.assistant_text(message)})
            elif role == "user" and pending_tools:
                out.append({"role": "user", "content": self._tools_text(tools) + content})
                pending_tools = False
            else:
                out.append({"role": role, "content": content})
        if pending_tools:  # no user message yet: the tools go in one of their own
            out.append({"role": "user", "content": self._tools_text(tools).rstrip()})
        return out

    @staticmethod
    def _tools_text(tools: list[dict]) -> str:
        text = (
            "Given the following functions, please respond with a JSON for a function call with its "
            "proper arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name '
            "and its value}.Do not use variables.\n\n"
        )
        return text + "".join(
            json.dumps(function_of(t), indent=4, ensure_ascii=False) + "\n\n" for t in tools
        )
