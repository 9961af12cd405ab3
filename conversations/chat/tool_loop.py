"""The chat's tool loop: tools offered in the prompt, calls run as nodes of the message tree.

With tools on, an answer's prompt carries the tools the user may use
(``conversations.tools.registry``) in the model's tool format (``inference.tools``:
``ToolFormat.render``). When the answer ends with calls (``ToolFormat.parse``) it is saved
with them (``Message.tool_calls``, finish reason ``tool_calls``) and the loop goes on below it,
one node at a time, each the thread's new leaf::

    user → assistant (tool_calls) → tool (result of call 1) → tool (call 2) → assistant …

Each ``tool`` node is a live node of the manager (``records.ToolRun``): it waits for the
user's approval when the conversation asks for it (``decide``; a denial is an error result),
runs the call with the server's timeout and the output cap, and saves the result, its
arguments and duration. A failing tool is an error result the model reads; the answer goes
on. After the last result a new answer starts under it. The loop ends when the user moves
the thread elsewhere, a step is stopped, or after ``CHAT_TOOL_MAX_ROUNDS`` rounds of calls,
after which the answer gets no tools (and its calls, if any, are left as text). One answer's
calls past ``CHAT_TOOL_MAX_CALLS`` are not run: each gets an error result saying so, which
the model reads, so every call still has its result node.

The loop reaches the manager only through ``records.AnswerHost`` and ends its nodes through
``conversations.chat.lifecycle``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.conf import settings

from conversations.chat import lifecycle
from conversations.chat.answer_rows import HEARTBEAT_SECONDS, update_message
from conversations.chat.groups import broadcast, conversation_group
from conversations.chat.prompt_history import HistoryRead
from conversations.chat.prompts import ToolPrompt
from conversations.chat.records import (
    Answer,
    AnswerHost,
    AnswerTools,
    LiveNode,
    StopReason,
    ToolRun,
    ToolStep,
)
from conversations.chat.tree import add_tool_step
from conversations.cluster.registry import PROCESS_ID
from conversations.models import Conversation, Message
from conversations.tools import registry
from conversations.tools.client import ToolResult, call_tool

if TYPE_CHECKING:
    from inference import AsyncEngine

log = logging.getLogger(__name__)

DENIED = "Error: the user did not allow this call."
STOPPED = "Error: the call was stopped before it finished."


def max_rounds() -> int:
    return int(getattr(settings, "CHAT_TOOL_MAX_ROUNDS", 5))


def max_calls() -> int:
    return max(0, int(getattr(settings, "CHAT_TOOL_MAX_CALLS", 8)))


def over_cap() -> str:
    return f"Error: not run: one answer may make at most {max_calls()} tool calls."


# The answer's side ------------------------------------------------------------------


class PromptTools:
    """``answer_prompt``'s ``tools_for`` for an answer of user ``owner_id``: the tools to
    render, if the conversation has tools on or calls in its history; ``chosen`` then says
    what was offered, for the answer's record."""

    def __init__(self, owner_id: int) -> None:
        self.owner_id = owner_id
        self.chosen: AnswerTools | None = None

    async def __call__(
        self, conversation: Conversation, history: HistoryRead, engine: AsyncEngine
    ) -> ToolPrompt | None:
        rounds = history.tool_rounds
        if not conversation.tools_enabled and not history.has_tool_calls:
            return None
        from inference.tools.formats import tool_format_for

        offered: list[dict] = []
        if conversation.tools_enabled and rounds < max_rounds():
            offered = (await registry.toolset_for(self.owner_id)).tools
        fmt = tool_format_for(engine.tokenizer)
        self.chosen = AnswerTools(fmt, bool(offered))
        return ToolPrompt(fmt, offered)


def split_calls(gen: Answer) -> None:
    """A finished answer that was offered tools: its calls apart from its text."""
    if gen.tools is None or not gen.tools.offered or gen.finish_reason != "stop" or gen.stop_reason:
        return
    content, calls = gen.tools.format.parse(gen.text)
    if calls:
        gen.text = content
        gen.tool_calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
        gen.finish_reason = "tool_calls"


def answer_fields(gen: Answer) -> dict:
    return {"tool_calls": gen.tool_calls} if gen.tool_calls else {}


async def after_answer(manager: AnswerHost, gen: Answer) -> None:
    """After an answer's final save: run its calls, if it made any and was not stopped."""
    if not gen.tool_calls or gen.stop_reason:
        return
    approval = await database_sync_to_async(_asks_approval)(gen.conversation_id)
    await _next_call(manager, gen, gen.message_id, gen.tool_calls, approval, max_calls())


def _asks_approval(conversation_id: int) -> bool:
    return bool(
        Conversation.all_objects.filter(pk=conversation_id).values_list("tools_approval", flat=True).first()
    )


async def _next_call(
    manager: AnswerHost, gen: LiveNode, parent_id: int, calls: list[dict], approval: bool, allowed: int
) -> None:
    call = calls[0]
    approval = approval and allowed > 0  # a call past the cap is never asked about
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
    step = ToolStep(call=call, remaining=calls[1:], approval=approval, allowed=allowed)
    manager.start_tool_step(
        conversation_id=gen.conversation_id, owner_id=gen.owner_id, message_id=message.pk, step=step
    )
    await _tree_changed(gen.conversation_id)


async def _next_answer(manager: AnswerHost, gen: LiveNode, parent_id: int) -> None:
    message = await database_sync_to_async(add_tool_step)(
        gen.conversation_id, parent_id, Message.Role.ASSISTANT, PROCESS_ID
    )
    if message is None:
        return
    manager.start_answer(conversation_id=gen.conversation_id, owner_id=gen.owner_id, message_id=message.pk)
    await _tree_changed(gen.conversation_id)


async def _tree_changed(conversation_id: int) -> None:
    """Every tab showing the conversation reads the thread again (the new node, an approval)."""
    await broadcast(conversation_group(conversation_id), "tree", origin="")


# The tool node's side -----------------------------------------------------------------


def decide(manager: AnswerHost, message_id: int, approved: bool) -> bool:
    """The user's answer to a call waiting for approval here; False if none waits here."""
    run = manager.get(message_id)
    if not isinstance(run, ToolRun):
        return False
    step = run.step
    if step.decision is None or step.decision.done():
        return False
    step.decision.set_result(bool(approved))
    return True


def stop_step(run: ToolRun) -> None:
    """Stop a tool node at once (a denial, a call under way): its result says it was stopped."""
    if run.step.work is not None and not run.step.work.done():
        run.step.work.cancel()


async def run_step(manager: AnswerHost, gen: ToolRun) -> None:
    """The task of a ``tool`` node: approval, the call, the save, then the loop's next node."""
    step = gen.step
    step.work = asyncio.ensure_future(_approve_and_call(gen, step))
    toucher = asyncio.ensure_future(_touch_while(gen, step.work))
    completed, approval = True, "pending" if step.approval else ""
    try:
        result, approval = await step.work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # this task itself was cancelled: stop the call too
            task.uncancel()
            step.work.cancel()
        result, completed = ToolResult(STOPPED, True, 0.0), False
        gen.stop_reason = gen.stop_reason or StopReason.CANCELLED
    except Exception as exc:  # never the answer's end: the model reads what went wrong
        log.exception("tool step %s failed", gen.message_id)
        result = ToolResult(f"Error: the call failed: {type(exc).__name__}", True, 0.0)
    toucher.cancel()
    approval = "denied" if approval == "pending" else approval
    fields = {
        "content": result.text,
        "tool_is_error": result.is_error,
        "tool_duration_ms": result.duration_ms,
        "tool_approval": approval,
    }
    forget = functools.partial(manager.forget, gen)
    written = await lifecycle.end_tool_step(manager, gen, completed=completed, fields=fields, forget=forget)
    if written and completed and not gen.stop_reason:
        if step.remaining:
            await _next_call(manager, gen, gen.message_id, step.remaining, step.approval, step.allowed - 1)
        else:
            await _next_answer(manager, gen, gen.message_id)


async def _touch_while(gen: ToolRun, work: asyncio.Task) -> None:
    """Touch the row now and then while the step waits or runs, as a live answer's partial saves
    do, so that it never looks orphaned; a row that is no longer this process's stops the step."""
    while not work.done():
        await asyncio.sleep(HEARTBEAT_SECONDS)
        if not work.done() and not await update_message(gen.message_id):
            gen.stop_reason = gen.stop_reason or StopReason.FENCED
            work.cancel()


async def _approve_and_call(gen: ToolRun, step: ToolStep) -> tuple[ToolResult, str]:
    if step.allowed <= 0:
        return ToolResult(over_cap(), True, 0.0), ""
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
