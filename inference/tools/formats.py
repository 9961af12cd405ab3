"""Tool-call formats: how tools, calls and results are written into a prompt, and how
calls are read back out of an answer.

Three formats:

- ``hermes``: Hermes / Qwen2.5 — tools listed in the system message inside ``<tools>``,
  each call ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, results
  in a user turn inside ``<tool_response>`` tags. The text is what Qwen2.5's own template
  writes, so prompts match the ones the model was trained on.
- ``llama3``: Llama 3.1 — tools described in the first user message, a call is the JSON
  ``{"name": ..., "parameters": {...}}``, results in an ``ipython`` turn.
- ``generic``: for templates with no tool support (SmolLM2): the hermes call syntax,
  with the tools and the syntax explained in the system message (see docs/interfaces.md).

Rendering produces plain ``{"role", "content"}`` messages, because ``Tokenizer`` passes
only those to the chat template (so a conversation's prefix stays stable across turns).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

from inference.tools.calls import ToolCall


class ToolFormat(Protocol):
    name: str  # "hermes", "llama3", "generic"
    trigger: str  # the text that opens a call (the lazy grammar switches on after it)

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]: ...

    def parse(self, text: str) -> tuple[str, list[ToolCall]]: ...

    # Extensions for constrained decoding: a call to ``name`` is exactly
    # ``call_begin(name) + <arguments JSON object> + call_end``.
    call_end: str

    def call_begin(self, name: str) -> str: ...


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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def assistant_text(fmt: ToolFormat, message: Mapping[str, Any]) -> str:
    """An assistant message carrying ``tool_calls`` as the text ``fmt`` writes for it: its
    content, then each call between ``call_begin(name)`` and ``call_end``."""
    parts = [text_of(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = arguments_object(fn.get("arguments", {}))
        parts.append(fmt.call_begin(fn.get("name", "")) + _dumps(args) + fmt.call_end)
    return "\n".join(parts)


def _call_of(obj: Any, arg_keys: tuple[str, ...]) -> ToolCall | None:
    """A ToolCall from a decoded ``{"name": ..., "<args>": {...}}``, or None if malformed."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    for key in arg_keys:
        if key in obj:
            args = arguments_object(obj[key])
            return ToolCall.new(obj["name"], _dumps(args)) if isinstance(args, dict) else None
    return None


class HermesFormat:
    """Hermes / Qwen2.5 ``<tool_call>`` format, rendered as Qwen2.5's template writes it."""

    name = "hermes"
    trigger = "<tool_call>"
    call_end = "}\n</tool_call>"
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
    _DEFAULT_SYSTEM = "You are a helpful assistant."

    def call_begin(self, name: str) -> str:
        return '<tool_call>\n{"name": ' + _dumps(name) + ', "arguments": '

    def tools_text(self, tools: list[dict]) -> str:
        lines = "\n".join(_dumps({"type": "function", "function": function_of(t)}) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        out: list[dict] = []
        rest = list(messages)
        if tools:
            system = self._DEFAULT_SYSTEM
            if rest and rest[0].get("role") == "system":
                system = text_of(rest.pop(0).get("content"))
            out.append({"role": "system", "content": f"{system}\n\n{self.tools_text(tools)}"})
        for message in rest:
            role = message.get("role")
            if role == "tool":
                block = f"<tool_response>\n{text_of(message.get('content'))}\n</tool_response>"
                if out and out[-1].get("_tool_results"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool_results": True})
            elif role == "assistant" and message.get("tool_calls"):
                out.append({"role": "assistant", "content": assistant_text(self, message)})
            else:
                out.append({"role": role, "content": text_of(message.get("content"))})
        return [{k: v for k, v in m.items() if not k.startswith("_")} for m in out]

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        kept: list[str] = []
        last = 0
        for match in self._CALL.finditer(text):
            try:
                call = _call_of(json.loads(match.group(1)), ("arguments", "parameters"))
            except ValueError:
                call = None
            if call is None:
                continue  # malformed: stays in the content
            calls.append(call)
            kept.append(text[last : match.start()])
            last = match.end()
        kept.append(text[last:])
        return "".join(kept).strip() if calls else text, calls


class GenericFormat(HermesFormat):
    """For templates without tool support: hermes call syntax, explained in the system
    message (documented in docs/interfaces.md, "Tool calls")."""

    name = "generic"

    def tools_text(self, tools: list[dict]) -> str:
        lines = "\n".join(_dumps(function_of(t)) for t in tools)
        return (
            "# Tools\n\nYou can call the functions below. Each is given as a JSON object with its "
            "name, description and a JSON schema of its parameters:\n<tools>\n"
            f"{lines}\n</tools>\n\nTo call a function, answer with one block per call, exactly like "
            'this:\n<tool_call>\n{"name": "<function name>", "arguments": <arguments as a JSON object>}\n'
            "</tool_call>\nWrite nothing after the last block. Each result comes back in a user "
            "message inside <tool_response></tool_response> tags."
        )


class Llama3Format:
    """Llama 3.1 JSON tool calls (``{"name": ..., "parameters": ...}``), tools in the
    first user message as Llama 3.1's template writes them by default."""

    name = "llama3"
    trigger = '{"name"'
    call_end = "}"
    _START = re.compile(r'\{\s*"name"')

    def call_begin(self, name: str) -> str:
        return '{"name": ' + _dumps(name) + ', "parameters": '

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        out: list[dict] = []
        pending_tools = bool(tools)
        for message in messages:
            role = message.get("role")
            content = text_of(message.get("content"))
            if role == "tool":
                out.append({"role": "ipython", "content": content})
            elif role == "assistant" and message.get("tool_calls"):
                out.append({"role": "assistant", "content": assistant_text(self, message)})
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

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        body = text.replace("<|python_tag|>", "")
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        kept: list[str] = []
        last = pos = 0
        while (match := self._START.search(body, pos)) is not None:
            try:
                obj, end = decoder.raw_decode(body, match.start())
            except ValueError:
                pos = match.end()
                continue
            call = _call_of(obj, ("parameters", "arguments"))
            if call is None:
                pos = end
                continue
            calls.append(call)
            kept.append(body[last : match.start()])
            last = pos = end
        kept.append(body[last:])
        if not calls:
            return text, []
        content = "".join(kept)
        return re.sub(r"^[\s;]+|[\s;]+$", "", content), calls


def format_named(name: str) -> ToolFormat:
    formats: dict[str, type] = {"hermes": HermesFormat, "llama3": Llama3Format, "generic": GenericFormat}
    return formats[name]()


def template_format_name(chat_template: Any) -> str:
    """The tool format a chat template writes: "hermes", "llama3" or "generic" (none)."""
    text = str(chat_template or "")
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or ("ipython" in text and "parameters" in text):
        return "llama3"
    return "generic"


def tool_format_for(tokenizer: Any) -> ToolFormat:
    """The model's own template format where it has one, else the generic format.
    ``tokenizer``: ``inference.tokenizer.Tokenizer`` or a Hugging Face tokenizer."""
    hf = getattr(tokenizer, "hf", tokenizer)
    return format_named(template_format_name(getattr(hf, "chat_template", None)))
