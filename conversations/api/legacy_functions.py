"""OpenAI's deprecated ``functions`` / ``function_call``, on top of ``tools``.

A request with ``functions`` becomes one with ``tools`` (each function a tool),
``tool_choice`` from ``function_call`` (``"none"``, ``"auto"`` or ``{"name": ...}``) and
no parallel calls (the old API returns one call). Its history follows: an assistant
message's ``function_call`` becomes a one-element ``tool_calls``, and a ``function``
message (the result, named by ``name``) a ``tool`` message answering that call. The answer
goes back in the old shape: ``message.function_call`` (streamed: ``delta.function_call``)
and ``finish_reason: "function_call"``, as OpenAI returns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conversations.api import schemas
from conversations.api.errors import invalid
from conversations.api.tool_calls import ToolPlan


def _call_id(i: int) -> str:
    return f"call_fn_{i}"


def as_tools(body: schemas.ChatCompletionRequest) -> tuple[schemas.ChatCompletionRequest, bool]:
    """``body`` with ``functions`` mapped to ``tools`` (unchanged without them), and
    whether it used the deprecated form (its answer is written back in that form)."""
    old_messages = any(m.role == "function" or m.function_call is not None for m in body.messages)
    if body.functions is None and body.function_call is None and not old_messages:
        return body, False
    if body.tools is not None or body.tool_choice is not None:
        raise invalid(
            "Give either functions/function_call or tools/tool_choice, not both.", param="functions"
        )
    functions = body.functions or []
    choice = body.function_call
    if isinstance(choice, dict):
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid("function_call must be 'none', 'auto' or {'name': ...}.", param="function_call")
        tool_choice: Any = {"type": "function", "function": {"name": name}}
    else:
        tool_choice = choice
    messages = []
    last_call: dict[str, str] = {}  # function name -> the id given to its latest call
    for i, message in enumerate(body.messages):
        if message.role == "assistant" and message.function_call is not None:
            call = schemas.ToolCallIn(id=_call_id(i), function=message.function_call)
            last_call[message.function_call.name] = call.id
            message = message.model_copy(update={"tool_calls": [call], "function_call": None})
        elif message.role == "function":
            call_id = last_call.get(message.name or "")
            if call_id is None:
                raise invalid(
                    f"messages[{i}] answers function {message.name!r}, which no earlier message called.",
                    param=f"messages[{i}].name",
                )
            message = message.model_copy(update={"role": "tool", "tool_call_id": call_id})
        messages.append(message)
    tools = [schemas.ToolSpec(type="function", function=f) for f in functions]
    mapped = body.model_copy(
        update={
            "tools": tools or None,
            "tool_choice": tool_choice if tools else None,
            "parallel_tool_calls": False,
            "functions": None,
            "function_call": None,
            "messages": messages,
        }
    )
    return mapped, True


@dataclass
class LegacyAnswer:
    """The tool plan's rewriting, then ``tool_calls`` -> ``function_call``."""

    plan: ToolPlan | None

    def rewrite_body(self, body: dict[str, Any]) -> dict[str, Any]:
        body = self.plan.rewrite_body(body) if self.plan else body
        for choice in body["choices"]:
            message = choice["message"]
            calls = message.pop("tool_calls", None)
            if calls:
                message["function_call"] = calls[0]["function"]
            if choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "function_call"
        return body

    def finish_reason(self, reasons: str) -> str:
        reasons = self.plan.finish_reason(reasons) if self.plan else reasons
        return reasons.replace("tool_calls", "function_call")

    def rewrite_chunk(self, choices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        chunks = self.plan.rewrite_chunk(choices) if self.plan else [choices]
        for chunk in chunks:
            for choice in chunk:
                delta = choice.get("delta") or {}
                calls = delta.pop("tool_calls", None)
                if calls:
                    delta["function_call"] = dict(calls[0].get("function") or {})
                if choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "function_call"
        return chunks
