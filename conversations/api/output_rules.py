"""What a chat request asks of its output: a grammar (``response_format``, ``guided_*``),
tools (rendered into the prompt, calls parsed out of the answer), both, or neither.

Both (an agent with tools and an output type): under ``tool_choice: auto`` the grammar
allows either tool calls or the answer in the requested format; under ``required`` or a
named function the call is the answer, and the format is not applied (OpenAI's rule)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conversations.api.structured import compile_or_400, grammar_spec, requested_formats
from conversations.api.tool_calls import ToolPlan, tool_plan

if TYPE_CHECKING:  # the engine's modules load with the engine, not with the site
    from inference.structured import GrammarSpec


@dataclass
class ChatOutputs:
    messages: list[dict[str, Any]]  # ready for the chat template
    grammar: Any = None  # inference.structured.GrammarSpec
    tools: ToolPlan | None = None


async def chat_outputs(
    engine: Any, body: Any, messages: list[dict[str, Any]], owner: str | None = None
) -> ChatOutputs:
    """The request's output rules. Checking schemas and rendering tools is CPU work that
    grows with the request (a schema of thousands of properties): it runs in a thread, so
    the event loop keeps serving every other request and stream meanwhile."""
    outputs, param = await asyncio.to_thread(_chat_outputs, engine, body, messages)
    if outputs.grammar is not None:
        await compile_or_400(engine, outputs.grammar, param or "response_format", owner)
    return outputs


def _chat_outputs(engine: Any, body: Any, messages: list[dict[str, Any]]) -> tuple[ChatOutputs, str | None]:
    spec = grammar_spec(body)
    param = next(iter(requested_formats(body)), None)
    has_tool_messages = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    plan = tool_plan(body, engine.tokenizer, has_tool_messages)
    if plan is not None:
        messages = plan.render(messages)
        if spec is None or not plan.active:
            spec, param = (plan.grammar(), "tools") if spec is None else (spec, param)
        elif plan.choice == "auto":  # a call, or the answer in the requested format
            spec = call_or_output(plan, spec)
        else:  # "required" or a named function: the tool wins (OpenAI's rule)
            spec, param = plan.grammar(), "tools"
    return ChatOutputs(messages, spec, plan), param


def call_or_output(plan: ToolPlan, output: GrammarSpec) -> GrammarSpec:
    """One grammar for ``tool_choice: auto`` with an output format: either the calls
    ``required`` would allow, or the output in its format (a JSON schema, a regex, ...)."""
    from inference.structured import GrammarSpec

    calls = json.loads(dataclasses.replace(plan, choice="required", streams={}, finishes={}).grammar().source)
    return GrammarSpec.structural_tag(
        {"type": "structural_tag", "format": {"type": "or", "elements": [calls["format"], _element(output)]}}
    )


def _element(spec: GrammarSpec) -> dict[str, Any]:
    """An output format as an element of a structural tag."""
    if spec.kind in ("json_schema", "json_object"):
        schema = json.loads(spec.source) if spec.kind == "json_schema" else {"type": "object"}
        # Compact JSON, as the format alone is compiled: free whitespace lets a model pad.
        return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}
    if spec.kind == "regex":
        return {"type": "regex", "pattern": spec.source}
    if spec.kind == "ebnf":
        return {"type": "grammar", "grammar": spec.source}
    if spec.kind == "choice":
        return {
            "type": "or",
            "elements": [{"type": "const_string", "value": c} for c in json.loads(spec.source)],
        }
    raise ValueError(f"no structural-tag element for a {spec.kind} grammar")


async def completion_grammar(engine: Any, body: Any, owner: str | None = None) -> Any:
    """A text completion's guided-decoding grammar (compiled, or a 400), or None; checked
    in a thread, as ``chat_outputs``."""
    spec = await asyncio.to_thread(grammar_spec, body)
    if spec is not None:
        await compile_or_400(engine, spec, next(iter(requested_formats(body))), owner)
    return spec
