"""gpt-oss's harmony format: a call is a ``commentary`` message addressed to the function,
``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``, one per
turn (``<|call|>`` ends the turn).

The engine's harmony splitter (``inference.sampling.harmony``) turns the answer's messages
into reasoning (the ``analysis`` channel) and answer text (the ``final`` channel, plain); a
message to a function stays in the answer as ``<|channel|>commentary to=functions.NAME
<|message|>{...}<|call|>``, which this format reads.

The family's template writes the tools (TypeScript-like signatures in a ``functions``
namespace of the developer message), earlier calls with the reasoning before them, and
results itself: ``render`` gives it native messages (``native``), and the caller passes the
tools to the template as its ``tools``.
"""

from __future__ import annotations

from inference.tools.base import (
    ARGS_OBJECT,
    CallFormat,
    arguments_object,
    result_name,
    text_of,
)
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import BareName, Lit, Ws

CALL_HEAD = "<|channel|>commentary to=functions."


def _native_call(call: dict) -> dict:
    fn = call.get("function", call)
    function = {"name": fn.get("name", ""), "arguments": arguments_object(fn.get("arguments", {}))}
    return {"id": call.get("id", ""), "type": "function", "function": function}


def _native(message: dict, names: dict) -> dict:
    """One OpenAI-shaped message as the template takes it: an answer's calls with their
    arguments as objects and its reasoning as ``thinking`` (the template writes an answer's
    content before its call on the analysis channel too, so the two are joined), a result
    with the name of the function it answers."""
    role = message.get("role")
    content = text_of(message.get("content"))
    if role == "assistant" and message.get("tool_calls"):
        calls = [_native_call(c) for c in message["tool_calls"]]
        names.update((str(c["id"]), c["function"]["name"]) for c in calls)
        thinking = "\n\n".join(t for t in (text_of(message.get("thinking")), content) if t)
        return {
            "role": role,
            "content": "",
            "tool_calls": calls,
            **({"thinking": thinking} if thinking else {}),
        }
    if role == "tool":
        name = result_name(message, names)
        return {
            "role": role,
            "content": content,
            "tool_call_id": message.get("tool_call_id", ""),
            "name": name,
        }
    return {"role": role, "content": content}


class HarmonyFormat(CallFormat):
    name = "harmony"
    trigger = CALL_HEAD
    call_end = "<|call|>"
    separator = ""
    max_calls = 1
    markers = (
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
    )
    syntax = CallSyntax(
        triggers=(CALL_HEAD,),
        head=(
            Lit(CALL_HEAD),
            BareName(stops=("<|",)),
            Ws(),
            Lit("<|constrain|>", optional=True),
            Lit("json", optional=True),
            Lit("<|message|>"),
            Ws(),
            ARGS_OBJECT,
        ),
        tail=(Ws(), Lit("<|call|>", optional=True)),
    )

    def call_begin(self, name: str) -> str:
        return f"{CALL_HEAD}{name} <|constrain|>json<|message|>"

    native = True

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        """Native messages, one for one; the template writes ``tools`` (passed to it apart)."""
        names: dict[str, str] = {}
        return [_native(m, names) for m in messages]
