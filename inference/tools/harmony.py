"""gpt-oss's harmony format: a call is a ``commentary`` message addressed to the function,
``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``, one per
turn (``<|call|>`` ends the turn).

The engine's harmony splitter (``inference.sampling.harmony``) turns the answer's messages
into reasoning (the ``analysis`` channel) and answer text (the ``final`` channel, plain); a
message to a function stays in the answer as ``<|channel|>commentary to=functions.NAME
<|message|>{...}<|call|>``, which this format reads. Tools are described in the system
message (the template makes it the developer message) as TypeScript-like signatures in a
``functions`` namespace, as the family's template writes them.
"""

from __future__ import annotations

from inference.tools.base import (
    ARGS_OBJECT,
    CallFormat,
    dumps,
    function_of,
    render_with_system,
    result_name,
    text_of,
)
from inference.tools.streaming import CallSyntax
from inference.tools.syntax import BareName, Lit, Ws

CALL_HEAD = "<|channel|>commentary to=functions."


def _ts_type(schema: object) -> str:
    """A JSON schema as the TypeScript-like type gpt-oss's template writes."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema:
        return " | ".join(dumps(v) for v in schema["enum"]) or "any"
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        required = set(schema.get("required") or [])
        fields = []
        for key, sub in (schema.get("properties") or {}).items():
            if isinstance(sub, dict) and sub.get("description"):
                fields.append(f"// {sub['description']}")
            fields.append(f"{key}{'' if key in required else '?'}: {_ts_type(sub)},")
        return "{\n" + "\n".join(fields) + "\n}" if fields else "object"
    if kind == "array":
        return f"{_ts_type(schema.get('items'))}[]"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}.get(
        str(kind), "any"
    )


def tools_text(tools: list[dict]) -> str:
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for tool in tools:
        fn = function_of(tool)
        if fn.get("description"):
            lines.append(f"// {fn['description']}")
        params = fn.get("parameters") or {}
        signature = f"(_: {_ts_type(params)}) => any" if params.get("properties") else "() => any"
        lines += [f"type {fn.get('name', '')} = {signature};", ""]
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _result(message: dict, names: dict) -> tuple[str, str]:
    return "user", f"functions.{result_name(message, names)} returned:\n{text_of(message.get('content'))}"


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

    def render(self, messages: list[dict], tools: list[dict]) -> list[dict]:
        return render_with_system(self, messages, tools, tools_text(tools), "", _result)
