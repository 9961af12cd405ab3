"""The chat's tool loop: tools offered in the prompt, calls run as nodes of the message tree.

With tools on, an answer's prompt carries the tools the user may use
(``conversations.tools.registry``) in the model's tool format (``inference.tools``:
``ToolFormat.render``). When the answer ends with calls (``ToolFormat.parse``) it is saved
with them (``Message.tool_calls``, finish reason ``tool_calls``) and the loop goes on below it,
one node at a time, each the thread's new leaf::

    user → assistant (tool_calls) → tool (result of call 1) → tool (call 2) → assistant …

Each ``tool`` node is a live "generation" of the manager (``ToolStep``): it waits for the
user's approval when the conversation asks for it (``decide``; a denial is an error result),
runs the call with the server's timeout and the output cap, and saves the result, its
arguments and duration. A failing tool is an error result the model reads; the answer goes
on. After the last result a new answer starts under it. The loop ends when the user moves
the thread elsewhere, a step is stopped, or after ``CHAT_TOOL_MAX_ROUNDS`` rounds of calls,
after which the answer gets no tools (and its calls, if any, are left as text).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from conversations.chat.answer_rows import HEARTBEAT_SECONDS, stored_message, update_message
from conversations.chat.groups import broadcast, conversation_group
from conversations.chat.prompt_history import HistoryRead
from conversations.chat.prompts import ToolPrompt
from conversations.chat.tree import add_tool_step
from conversations.cluster.registry import PROCESS_ID
from conversations.models import Message
from conversations.tools import registry
from conversations.tools.client import ToolResult, call_tool

log = logging.getLogger(__name__)

DENIED = "Error: the user did not allow this call."
STOPPED = "Error: the call was stopped before it finished."


@dataclass
class AnswerTools:
    """An answer's tool format, and whether tools were offered to it (then its calls run)."""

    format: Any
    offered: bool


@dataclass
class ToolStep:
    """A ``tool`` node being worked on: its call, the calls after it, and its approval."""

    call: dict  # {"id", "name", "arguments"}
    remaining: list[dict]
    approval: bool  # wait for the user's decision first
    decision: asyncio.Future | None = None
    work: asyncio.Task | None = None


def max_rounds() -> int:
    return int(getattr(settings, "CHAT_TOOL_MAX_ROUNDS", 5))


# The answer's side ------------------------------------------------------------------


def prompt_tools(gen: Any):
    """``answer_prompt``'s ``tools_for`` for the answer ``gen``: the tools to render, if the
    conversation has tools on or calls in its history; notes on ``gen`` what was offered."""

    async def tools_for(conversation, history: HistoryRead, engine: Any) -> ToolPrompt | None:
        rounds = history.tool_rounds
        if not conversation.tools_enabled and not history.has_tool_calls:
            return None
        from inference.tools.formats import tool_format_for

        offered: list[dict] = []
        if conversation.tools_enabled and rounds < max_rounds():
            offered = (await registry.toolset_for(gen.owner_id)).tools
        fmt = tool_format_for(engine.tokenizer)
        gen.tools = AnswerTools(fmt, bool(offered))
        return ToolPrompt(fmt, offered)

    return tools_for


def split_calls(gen: Any) -> None:
    """A finished answer that was offered tools: its calls apart from its text."""
    if gen.tools is None or not gen.tools.offered or gen.finish_reason != "stop" or gen.stop_reason:
        return
    content, calls = gen.tools.format.parse(gen.text)
    if calls:
        gen.text = content
        gen.tool_calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
        gen.finish_reason = "tool_calls"


def answer_fields(gen: Any) -> dict:
    return {"tool_calls": gen.tool_calls} if gen.tool_calls else {}


async def after_answer(manager: Any, gen: Any) -> None:
    """After an answer's final save: run its calls, if it made any and was not stopped."""
    if not gen.tool_calls or gen.stop_reason:
        return
    approval = await database_sync_to_async(_asks_approval)(gen.conversation_id)
    await _next_call(manager, gen, gen.message_id, gen.tool_calls, approval)


def _asks_approval(conversation_id: int) -> bool:
    from conversations.models import Conversation

    return bool(
        Conversation.all_objects.filter(pk=conversation_id).values_list("tools_approval", flat=True).first()
    )


async def _next_call(manager: Any, gen: Any, parent_id: int, calls: list[dict], approval: bool) -> None:
    call = calls[0]
    message = await database_sync_to_async(add_tool_step)(
        gen.conversation_id,
        parent_id,
        Message.Role.TOOL,
        PROCESS_ID,
        tool_call_id=str(call["id"])[:64],
        tool_name=str(call["name"])[:128],
        tool_arguments=str(call["arguments"]),
        tool_approval="pending" if approval else "",
    )
    if message is None:
        return
    step = ToolStep(call=call, remaining=calls[1:], approval=approval)
    manager.start(
        conversation_id=gen.conversation_id, owner_id=gen.owner_id, message_id=message.pk, tool=step
    )
    await _tree_changed(gen.conversation_id)


async def _next_answer(manager: Any, gen: Any, parent_id: int) -> None:
    message = await database_sync_to_async(add_tool_step)(
        gen.conversation_id, parent_id, Message.Role.ASSISTANT, PROCESS_ID
    )
    if message is None:
        return
    manager.start(conversation_id=gen.conversation_id, owner_id=gen.owner_id, message_id=message.pk)
    await _tree_changed(gen.conversation_id)


async def _tree_changed(conversation_id: int) -> None:
    """Every tab showing the conversation reads the thread again (the new node, an approval)."""
    await broadcast(conversation_group(conversation_id), "tree", origin="")


# The tool node's side -----------------------------------------------------------------


def decide(manager: Any, message_id: int, approved: bool) -> bool:
    """The user's answer to a call waiting for approval here; False if none waits here."""
    gen = manager.get(message_id)
    step = getattr(gen, "tool", None)
    if step is None or step.decision is None or step.decision.done():
        return False
    step.decision.set_result(bool(approved))
    return True


def stop_step(gen: Any) -> None:
    """Stop a tool node at once (a denial, a call under way): its result says it was stopped."""
    if gen.tool.work is not None and not gen.tool.work.done():
        gen.tool.work.cancel()


async def run_step(manager: Any, gen: Any) -> None:
    """The task of a ``tool`` node: approval, the call, the save, then the loop's next node."""
    step: ToolStep = gen.tool
    step.work = asyncio.ensure_future(_approve_and_call(gen, step))
    toucher = asyncio.ensure_future(_touch_while(gen, step.work))
    status, approval = Message.Status.COMPLETE, "pending" if step.approval else ""
    try:
        result, approval = await step.work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # this task itself was cancelled: stop the call too
            task.uncancel()
            step.work.cancel()
        result, status = ToolResult(STOPPED, True, 0.0), Message.Status.INTERRUPTED
        gen.stop_reason = gen.stop_reason or "cancelled"
    except Exception as exc:  # never the answer's end: the model reads what went wrong
        log.exception("tool step %s failed", gen.message_id)
        result = ToolResult(f"Error: the call failed: {type(exc).__name__}", True, 0.0)
    toucher.cancel()
    approval = "denied" if approval == "pending" else approval
    written = await _save_step(manager, gen, result, status, approval)
    if written and status == Message.Status.COMPLETE and not gen.stop_reason:
        if step.remaining:
            await _next_call(manager, gen, gen.message_id, step.remaining, step.approval)
        else:
            await _next_answer(manager, gen, gen.message_id)


async def _touch_while(gen: Any, work: asyncio.Task) -> None:
    """Touch the row now and then while the step waits or runs, as a live answer's partial saves
    do, so that it never looks orphaned; a row that is no longer this process's stops the step."""
    while not work.done():
        await asyncio.sleep(HEARTBEAT_SECONDS)
        if not work.done() and not await update_message(gen.message_id):
            gen.stop_reason = gen.stop_reason or "fenced"
            work.cancel()


async def _approve_and_call(gen: Any, step: ToolStep) -> tuple[ToolResult, str]:
    approval = ""
    if step.approval:
        step.decision = asyncio.get_running_loop().create_future()
        approval = "approved" if await step.decision else "denied"
        await update_message(gen.message_id, tool_approval=approval)
        await _tree_changed(gen.conversation_id)
        if approval == "denied":
            return ToolResult(DENIED, True, 0.0), approval
    return await _call(gen.owner_id, step.call), approval


async def _call(user_id: int, call: dict) -> ToolResult:
    target = await registry.route(user_id, call["name"])
    if target is None:
        return ToolResult(f"Error: no tool named {call['name']!r} is available.", True, 0.0)
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return ToolResult("Error: the arguments are not a JSON object.", True, 0.0)
    spec, name = target
    limit = int(getattr(settings, "CHAT_TOOL_OUTPUT_MAX_CHARS", 8000))
    return await call_tool(spec, name, arguments, max_chars=limit)


async def _save_step(manager: Any, gen: Any, result: ToolResult, status: str, approval: str) -> int:
    """The node's final save (fenced like an answer's), then the news to every tab."""
    written = 0
    try:
        written = await update_message(
            gen.message_id,
            content=result.text,
            status=status,
            finish_reason="stop" if status == Message.Status.COMPLETE else "abort",
            tool_is_error=result.is_error,
            tool_duration_ms=result.duration_ms,
            tool_approval=approval,
        )
    except Exception:
        log.exception("final save of tool message %s failed", gen.message_id)
    finally:
        manager.forget(gen)
    message = await stored_message(gen.message_id)
    if message is not None and message["status"] != Message.Status.STREAMING:
        event = {"type": "finished", "conversation_id": gen.conversation_id, "message": message}
        manager._emit(gen.conversation_id, event)
        await broadcast(
            conversation_group(gen.conversation_id), "finished", message_id=gen.message_id, message=message
        )
    return written
