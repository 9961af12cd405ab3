"""``tools``, ``tool_choice`` and ``parallel_tool_calls`` on /v1/chat/completions.

The model's tool format (``inference.tools.tool_format_for``: its template's own, else the
generic one) writes the tools, earlier calls and their results into the prompt and reads
calls back out of the answer. Constrained decoding keeps calls well formed
(``conversations.api.tool_grammar``):

- ``auto``: free text until the format's trigger (``<tool_call>``, ``[TOOL_CALLS]``, Llama's
  ``{"name"``), then a list of calls whose names are tools and whose arguments match their
  schemas (a lazy grammar);
- ``required`` / a named function: calls only, from the first token;
- ``none``: the tools are left out of the prompt and nothing is parsed.

A list holds at most ``API_TOOL_MAX_PARALLEL_CALLS`` calls (one with ``parallel_tool_calls:
false`` or a named function, and no more than the family allows), and the answer ends after
it. Streamed or not, the answer is read by the same parser (``inference.tools.streaming``),
so both give the same content and calls: a call cut by ``max_tokens`` is a call with the
arguments it got (finish reason ``length``) and no markup reaches the content; a call that
repeats an earlier one ends the list (finish reason ``tool_calls``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from conversations.api.errors import invalid
from conversations.api.structured import check_schema
from conversations.api.tool_grammar import tool_call_grammar
from conversations.api.tool_stream import ToolCallStream

DEFAULT_MAX_PARALLEL_CALLS = 8


@dataclass
class ToolPlan:
    format: Any  # inference.tools.ToolFormat
    tools: list[dict[str, Any]]  # OpenAI tools, as sent
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True
    streams: dict[int, ToolCallStream] = field(default_factory=dict)
    finishes: dict[int, str] = field(default_factory=dict)  # choice index -> its finish reason

    @property
    def active(self) -> bool:
        """Calls may come back (tools offered and not ``none``)."""
        return bool(self.tools) and self.choice != "none"

    def render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.format.render(messages, self.tools if self.active else [])

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the template's own ``tools``, where the format leaves them to it."""
        return self.tools if self.active and getattr(self.format, "native", False) else None

    @property
    def max_calls(self) -> int:
        """How many calls one answer may make."""
        limit = int(getattr(settings, "API_TOOL_MAX_PARALLEL_CALLS", DEFAULT_MAX_PARALLEL_CALLS))
        if self.choice == "named" or not self.parallel:
            limit = 1
        family = getattr(self.format, "max_calls", None)
        return max(1, min(limit, family) if family else limit)

    def grammar(self) -> Any:
        """The structural-tag grammar of the allowed calls, or None under ``none``."""
        if not self.active:
            return None
        functions = [t["function"] for t in self.tools]
        if self.choice == "named":
            functions = [f for f in functions if f["name"] == self.named]
        return tool_call_grammar(self.format, functions, self.choice, self.max_calls)

    # ---- answers ---------------------------------------------------------------------
    def rewrite_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A finished chat completion with each choice's calls moved into ``tool_calls``."""
        if not self.active:
            return body
        for choice in body["choices"]:
            message = choice["message"]
            parsed = self.format.parse_answer(
                message.get("content") or "", cut=choice["finish_reason"] == "length"
            )
            if parsed.calls:
                message["content"] = parsed.content or None
            elif message.get("content") is not None:
                message["content"] = parsed.content  # the text itself, less markup a cut left
            if parsed.calls:
                message["tool_calls"] = [c.to_openai() for c in parsed.calls]
                choice["finish_reason"] = _finish(choice["finish_reason"], parsed.repeated)
            self.finishes[choice["index"]] = choice["finish_reason"]
        return body

    def finish_reason(self, reasons: str) -> str:
        """The usage log's finish reasons (comma-joined) with "tool_calls" where calls ended a choice."""
        if not self.active or not self.finishes:
            return reasons
        return ",".join(sorted(set(self.finishes.values())))

    def rewrite_chunk(self, choices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """A stream chunk's ``choices`` -> the chunks to send: content deltas become
        ``tool_calls`` deltas in OpenAI's incremental shape (index, id, type and name
        first, then the arguments in pieces); a choice that called ends "tool_calls"."""
        if not self.active:
            return [choices]
        out: list[list[dict[str, Any]]] = []
        for choice in choices:
            stream = self.streams.setdefault(choice["index"], ToolCallStream(self.format))
            delta = choice.get("delta") or {}
            pieces = stream.feed(delta["content"]) if delta.get("content") else []
            if choice.get("finish_reason"):
                pieces += stream.finish(cut=choice["finish_reason"] == "length")
            rest = {k: v for k, v in delta.items() if k != "content"}
            for piece in pieces:
                out.append([{**choice, "delta": {**rest, **piece}, "finish_reason": None}])
                rest = {k: v for k, v in rest.items() if k == "role"}
            if choice.get("finish_reason"):
                reason = choice["finish_reason"]
                if stream.num_calls:
                    reason = _finish(reason, stream.repeated)
                self.finishes[choice["index"]] = reason
                out.append([{**choice, "delta": {}, "logprobs": None, "finish_reason": reason}])
            elif not pieces and (rest or choice.get("logprobs")):
                out.append([{**choice, "delta": {**rest, "content": ""}}])
        return out


def _finish(reason: str, repeated: bool) -> str:
    """A choice's finish reason once it made calls: "tool_calls" where the model ended its
    list (its end token, or a repeated call), else what stopped it ("length")."""
    return "tool_calls" if reason == "stop" or repeated else reason


def _validate_tools(tools: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        data = tool if isinstance(tool, dict) else tool.dict(exclude_none=True)
        data = copy.deepcopy(data)
        function = data["function"]
        if function["name"] in names:
            raise invalid(f"Duplicate tool name {function['name']!r}.", param=f"tools[{i}].function.name")
        names.add(function["name"])
        if function.get("parameters") is not None:
            function["parameters"] = check_schema(function["parameters"], f"tools[{i}].function.parameters")
        out.append(data)
    return out


def _choice(tool_choice: Any, names: set[str]) -> tuple[str, str | None]:
    if tool_choice is None:
        return ("auto" if names else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise invalid(
                f"Unsupported tool_choice {tool_choice!r}: use 'none', 'auto', 'required' or a function.",
                param="tool_choice",
            )
        if tool_choice != "none" and not names:
            raise invalid(f"tool_choice {tool_choice!r} needs tools.", param="tool_choice")
        return tool_choice, None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
        raise invalid("tool_choice must be a string or {'type': 'function', ...}.", param="tool_choice")
    name = (tool_choice.get("function") or {}).get("name")
    if not isinstance(name, str) or name not in names:
        raise invalid(f"tool_choice names an unknown tool {name!r}.", param="tool_choice.function.name")
    return "named", name


def tool_plan(body: Any, tokenizer: Any, has_tool_messages: bool) -> ToolPlan | None:
    """The request's tool plan, or None when it neither offers tools nor carries calls."""
    from inference.tools import tool_format_for

    tools = _validate_tools(body.tools or [])
    choice, named = _choice(body.tool_choice, {t["function"]["name"] for t in tools})
    if not tools and not has_tool_messages:
        return None
    parallel = True if body.parallel_tool_calls is None else bool(body.parallel_tool_calls)
    return ToolPlan(tool_format_for(tokenizer), tools, choice, named, parallel)


def message_extras(message: Any) -> dict[str, Any]:
    """A request message's ``tool_calls`` / ``tool_call_id``, as plain dicts."""
    extras: dict[str, Any] = {}
    if getattr(message, "tool_calls", None):
        extras["tool_calls"] = [c.dict() if hasattr(c, "dict") else c for c in message.tool_calls]
    if getattr(message, "tool_call_id", None):
        extras["tool_call_id"] = message.tool_call_id
    return extras
