"""Tool-call formats: the one place that picks a model's format, from its chat template.

Each family's format lives in its own module (``hermes``, ``llama3``, ``mistral``,
``granite``, ``harmony``); ``tool_format_for`` reads the markers the model's chat template
writes and picks the matching one, else the documented generic format (hermes syntax,
explained in the system message). A format renders OpenAI-shaped messages and tools into
plain messages the template can encode (``Tokenizer`` passes only role and content to the
template, so a conversation's prefix stays stable across turns), reads calls back out of an
answer (``inference.tools.streaming``, the same parser streamed or not), and gives the text
of well-formed calls for constrained decoding (``inference.tools.base``).
"""

from __future__ import annotations

from typing import Any, Protocol

from inference.tools.base import arguments_object, dumps, function_of, text_of
from inference.tools.granite import GraniteFormat
from inference.tools.harmony import HarmonyFormat
from inference.tools.hermes import GenericFormat, HermesFormat
from inference.tools.llama3 import Llama3Format
from inference.tools.mistral import MistralArgsFormat, MistralFormat
from inference.tools.streaming import CallSyntax, ParsedAnswer

__all__ = [
    "FORMATS",
    "GenericFormat",
    "GraniteFormat",
    "HarmonyFormat",
    "HermesFormat",
    "Llama3Format",
    "MistralArgsFormat",
    "MistralFormat",
    "ToolFormat",
    "arguments_object",
    "dumps",
    "format_named",
    "function_of",
    "template_format_name",
    "text_of",
    "tool_format_for",
]


class ToolFormat(Protocol):
    name: str
    trigger: str  # the text that opens a list of calls (the lazy grammar switches on after it)
    syntax: CallSyntax  # how calls are read back
    # Constrained decoding: list_open + call (+ separator + call)* + list_close, a call to
    # ``name`` being call_begin(name) + <arguments JSON object> + call_end.
    list_open: str
    call_end: str
    separator: str
    list_close: str
    max_calls: int | None  # the family's own limit on calls per answer (harmony: one)

    def call_begin(self, name: str) -> str: ...

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]: ...

    def parse(self, text: str) -> tuple[str, list]: ...

    def parse_answer(self, text: str, cut: bool = False) -> ParsedAnswer: ...


FORMATS: dict[str, type] = {
    f.name: f
    for f in (
        HermesFormat,
        GenericFormat,
        Llama3Format,
        MistralFormat,
        MistralArgsFormat,
        GraniteFormat,
        HarmonyFormat,
    )
}


def format_named(name: str) -> ToolFormat:
    return FORMATS[name]()


def template_format_name(chat_template: Any) -> str:
    """The tool format a chat template writes, from the markers in it; "generic" when none."""
    text = str(chat_template or "")
    if "<|channel|>" in text:  # gpt-oss harmony
        return "harmony"
    if "[TOOL_CALLS]" in text:
        return "mistral_args" if "[ARGS]" in text else "mistral"
    if "<|tool_call|>" in text:  # Granite 3.x
        return "granite"
    if "<tool_call>" in text:  # Hermes, Qwen2.5, Qwen3, SmolLM3
        return "hermes"
    if "<|python_tag|>" in text or ("ipython" in text and "parameters" in text):
        return "llama3"
    return "generic"


def tool_format_for(tokenizer: Any) -> ToolFormat:
    """The model's own template format where it has one, else the generic format.
    ``tokenizer``: ``inference.tokenizer.Tokenizer`` or a Hugging Face tokenizer."""
    hf = getattr(tokenizer, "hf", tokenizer)
    return format_named(template_format_name(getattr(hf, "chat_template", None)))
