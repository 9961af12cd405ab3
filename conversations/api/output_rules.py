"""What a chat request asks of its output: a grammar (``response_format``, ``guided_*``),
tools (rendered into the prompt, calls parsed out of the answer), or neither."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from conversations.api.errors import invalid
from conversations.api.structured import compile_or_400, grammar_spec, requested_formats
from conversations.api.tool_calls import ToolPlan, tool_plan


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
        if spec is not None and plan.active:
            raise invalid(
                f"{param} together with tools is not supported: set tool_choice to 'none' or drop one.",
                param=param,
            )
        messages = plan.render(messages)
        if spec is None:
            spec, param = plan.grammar(), "tools"
    return ChatOutputs(messages, spec, plan), param


async def completion_grammar(engine: Any, body: Any, owner: str | None = None) -> Any:
    """A text completion's guided-decoding grammar (compiled, or a 400), or None; checked
    in a thread, as ``chat_outputs``."""
    spec = await asyncio.to_thread(grammar_spec, body)
    if spec is not None:
        await compile_or_400(engine, spec, next(iter(requested_formats(body))), owner)
    return spec
