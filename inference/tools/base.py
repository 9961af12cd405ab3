"""What every tool-call format shares: the helpers that write OpenAI-shaped messages as
plain text, and ``CallFormat``, the base of the format classes (one module per family).

A format says three things:

- how the tools, earlier calls and their results are written into plain ``{"role",
  "content"}`` messages (``render``), as the family's own template writes them as far as
  plain messages can: ``Tokenizer`` passes only role and content to the template;
- how calls are read back (``syntax``, for ``inference.tools.streaming``);
- the exact text of well-formed calls for constrained decoding: a list of calls is
  ``list_open + call (+ separator + call)* + list_close`` where a call to ``name`` is
  ``call_begin(name) + <arguments JSON object> + call_end``; ``trigger`` starts every list
  (the lazy grammar switches on there) and ``max_calls`` caps what the family allows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inference.tools.streaming import CallSyntax, ParsedAnswer, parse_answer
from inference.tools.syntax import JsonName, Lit, Ws


def function_of(tool: Mapping[str, Any]) -> dict:
    """An OpenAI tool (``{"type": "function", "function": {...}}``) -> its function dict
    (name, description, parameters); a bare function dict is accepted too."""
    return dict(tool.get("function", tool))


def text_of(content: Any) -> str:
    """A message's content as text: a string, None, or OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))


def arguments_object(arguments: Any) -> Any:
    """A call's arguments as a JSON value (OpenAI sends them as JSON text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# The arguments are a JSON object: a head followed by anything else is not a call.
ARGS_OBJECT = Lit("{", peek=True)


def json_head(opening: tuple[Lit, ...], args_keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple:
    """A call head ``<opening> {"name": "<name>", "<args key>": `` (any whitespace)."""
    key = Lit(f'"{args_keys[0]}"', alts=tuple(f'"{k}"' for k in args_keys[1:]))
    return (
        *opening,
        Ws(),
        Lit("{"),
        Ws(),
        Lit('"name"'),
        Ws(),
        Lit(":"),
        Ws(),
        JsonName(),
        Ws(),
        Lit(","),
        Ws(),
        key,
        Ws(),
        Lit(":"),
        Ws(),
        ARGS_OBJECT,
    )


class CallFormat:
    name = "base"
    trigger = ""
    syntax: CallSyntax
    list_open = ""
    call_end = "}"
    separator = "\n"
    list_close = ""
    max_calls: int | None = None  # the family's own limit on calls per answer
    markers: tuple[str, ...] = ()  # the special tokens its calls are written with
    # Whether ``render`` gives native messages (``inference.prompt.types.NATIVE_FIELDS``) and
    # leaves the tools to the template's ``tools``, rather than plain text.
    native = False

    def call_begin(self, name: str) -> str:
        raise NotImplementedError

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        raise NotImplementedError

    def calls_text(self, calls: list[Mapping[str, Any]]) -> str:
        """OpenAI ``tool_calls`` as this format writes them."""
        written = []
        for call in calls:
            fn = call.get("function", call)
            args = arguments_object(fn.get("arguments", {}))
            written.append(self.call_begin(fn.get("name", "")) + dumps(args) + self.call_end)
        return self.list_open + self.separator.join(written) + self.list_close

    def assistant_text(self, message: Mapping[str, Any]) -> str:
        """An assistant message with ``tool_calls``: its content, then its calls."""
        parts = [text_of(message.get("content"))] if message.get("content") else []
        if message.get("tool_calls"):
            parts.append(self.calls_text(message["tool_calls"]))
        return "\n".join(parts)

    def parse_answer(self, text: str, cut: bool = False) -> ParsedAnswer:
        return parse_answer(self, text, cut)

    def parse(self, text: str) -> tuple[str, list]:
        """A finished answer's (content, calls); the content is ``text`` itself without calls."""
        parsed = parse_answer(self, text)
        return (parsed.content if parsed.calls else text), parsed.calls


def render_with_system(
    fmt: CallFormat,
    messages: list[dict],
    tools: list[dict],
    tools_text: str,
    default_system: str,
    result: Any,
    merge_results: bool = True,
) -> list[dict]:
    """The common shape: the tools described at the end of the system message (one is made
    from ``default_system`` if there is none), calls in the assistant's content, each result
    as ``result(message, call_names) -> (role, text)``; consecutive results are joined into one
    message with ``merge_results`` (templates that want user and assistant turns to alternate)."""
    out: list[dict] = []
    rest = list(messages)
    if tools:
        system = default_system
        if rest and rest[0].get("role") == "system":
            system = text_of(rest.pop(0).get("content"))
        out.append({"role": "system", "content": f"{system}\n\n{tools_text}" if system else tools_text})
    names: dict[str, str] = {}
    for message in rest:
        role = message.get("role")
        if role == "tool":
            result_role, block = result(message, names)
            if merge_results and out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": result_role, "content": block, "_tool_results": True})
        elif role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                fn = call.get("function", call)
                names[str(call.get("id", ""))] = fn.get("name", "")
            out.append({"role": "assistant", "content": fmt.assistant_text(message)})
        else:
            out.append({"role": role, "content": text_of(message.get("content"))})
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in out]


def result_name(message: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """The name of the function a ``tool`` message answers (its ``name``, else its call's)."""
    return str(message.get("name") or names.get(str(message.get("tool_call_id", "")), ""))
