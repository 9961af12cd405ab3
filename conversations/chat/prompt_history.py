"""A conversation's history for its next prompt, read only as far back as the context reaches.

A thread can be far longer than the model's context, and its prompt keeps only the newest
turns (``conversations.chat.prompts``). So the path is read as (id, parent) pairs, then the
rows themselves newest first, a page at a time, until their guessed tokens pass what the
context can hold. The reads are short calls on Channels' database thread (one thread shared
by every consumer); rendering and tokenising run in a worker thread. Should the guess fall
short, the builder asks for older messages and more is read.

Once a thread outgrew the context, where its prompt starts is kept on
``Conversation.context_start`` (see ``build_prompt``): it is read back on every prompt and
written by the answer path alone (a quick update on the database thread), never by the
retention's look at the thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.db.models import BooleanField, ExpressionWrapper, Q

from conversations.chat.prompts import (
    FRAME_TOKENS,
    TOOL_FIELDS,
    NeedEarlierHistory,
    PromptPlan,
    ToolPrompt,
    build_prompt,
    estimated_tokens,
)
from conversations.chat.token_fingerprint import cached_fingerprint, token_fingerprint
from conversations.chat.tree import Tree, path_rows
from conversations.documents.in_prompt import AttachedDocuments, attached, ground_question
from conversations.models import Conversation, Message

if TYPE_CHECKING:
    from inference import AsyncEngine

# Rows per query when reading a path newest first (well under SQLite's variable limit).
PAGE = 256


def first_reach(max_model_len: int) -> int:
    """Tokens of history read at first: the context and a half, so that the builder can
    see where the turns that fit begin (it asks for more should that fall short)."""
    return max_model_len + max_model_len // 2 + 64


@dataclass
class HistoryRead:
    messages: list[dict]  # oldest first: id, role, content, reasoning, token_ids, TOOL_FIELDS
    earlier: int  # older messages of the path left unread
    # Of the whole path: answers with tool calls since its last user message, and whether
    # any message on it has calls (the tool loop's round limit and whether to render tools).
    tool_rounds: int = 0
    has_tool_calls: bool = False


@dataclass
class PlannedPrompt:
    conversation: Conversation
    history: HistoryRead
    plan: PromptPlan
    fingerprint: str  # the engine's token_fingerprint, to store with new ids


def read_history(
    conversation_id: int,
    leaf_id: int | None,
    *,
    fingerprint: str,
    reach: int,
    streaming: bool = True,
    start_id: int | None = None,
    on_path: list[tuple] | None = None,
    in_hand: dict[int, dict] | None = None,
) -> HistoryRead:
    """Synchronous: the prompt-worthy messages on the path to ``leaf_id`` (no failed
    answers, no empty ones; no streaming ones unless ``streaming``), newest first until
    about ``reach`` tokens and a user message, the oldest read, and back to ``start_id``
    if it is on the path not far before that. Stored ids under another fingerprint than
    ``fingerprint`` are left out. ``on_path``: the path as ``tree_path`` gives it, where
    the caller holds the tree (else it is read); ``in_hand``: rows as ``_rows`` reads them
    that the caller holds already (not read again)."""
    if on_path is None:
        # An answer that only called tools has no text but is part of the prompt.
        blank = ExpressionWrapper(Q(content="", tool_calls__isnull=True), output_field=BooleanField())
        calls = ExpressionWrapper(Q(tool_calls__isnull=False), output_field=BooleanField())
        on_path = path_rows(conversation_id, leaf_id, "role", "status", blank, calls)
    path = [
        (pk, role)
        for pk, role, status, empty, _ in on_path
        if status != Message.Status.ERROR
        and not (empty and role == Message.Role.ASSISTANT)
        and (streaming or status != Message.Status.STREAMING)
    ]
    rounds, has_calls = tool_rounds((role, called) for _, role, _, _, called in on_path)
    messages: list[dict] = []
    tokens, begin = 0, len(path)
    # The stored start, if on the path: a history that fitted takes fewer messages than this.
    anchor = next((i for i, (pk, _) in enumerate(path) if pk == start_id), None)
    if anchor is not None and len(path) - anchor > reach // FRAME_TOKENS:
        anchor = None
    while begin > 0 and (tokens < reach or (anchor is not None and begin > anchor)):
        end, begin = begin, max(0, begin - PAGE)
        while begin > 0 and path[begin][1] != Message.Role.USER:
            begin -= 1  # whole turns: a page starts with a question
        ids = [pk for pk, _ in path[begin:end]]
        held = {pk: in_hand[pk] for pk in ids if pk in in_hand} if in_hand else {}
        missing = [pk for pk in ids if pk not in held]
        rows = {**(_rows(missing) if missing else {}), **held}
        page = [_item(rows[pk], fingerprint) for pk in ids if pk in rows]
        tokens += sum(estimated_tokens(item) for item in page)
        messages[:0] = page
    return HistoryRead(messages=messages, earlier=begin, tool_rounds=rounds, has_tool_calls=has_calls)


def tree_path(tree: Tree, leaf_id: int | None) -> list[tuple]:
    """The path to ``leaf_id`` in a loaded tree, as ``read_history`` reads it from the
    database: ``(id, role, status, blank, has tool calls)`` from the root down."""
    leaf = tree.by_id.get(leaf_id) if leaf_id is not None else None
    if leaf is None:
        return []
    return [
        (m.pk, m.role, m.status, m.content == "" and m.tool_calls is None, m.tool_calls is not None)
        for m in tree.path_to(leaf)
    ]


def tool_rounds(path: Iterable[tuple[str, bool]]) -> tuple[int, bool]:
    """``(role, has tool calls)`` of a path, oldest first: the answers with calls since its
    last user message, and whether any message has calls."""
    rounds, seen = 0, False
    for role, called in path:
        seen = seen or bool(called)
        if role == Message.Role.USER:
            rounds = 0
        elif called:
            rounds += 1
    return rounds, seen


ROW_FIELDS = ("id", "role", "content", "reasoning", "token_ids", "token_fingerprint", *TOOL_FIELDS)


def _rows(ids: list[int]) -> dict[int, dict]:
    """The prompt's fields of messages ``ids`` (a turn may stretch a page: query in pages)."""
    fields = ROW_FIELDS
    rows: dict[int, dict] = {}
    for first in range(0, len(ids), PAGE):
        chunk = ids[first : first + PAGE]
        rows.update((row["id"], row) for row in Message.objects.filter(pk__in=chunk).values(*fields))
    return rows


def _item(row: dict, fingerprint: str) -> dict:
    ids = row["token_ids"] if row["token_fingerprint"] == fingerprint else None
    return {
        "id": row["id"],
        "role": row["role"],
        "content": row["content"],
        "reasoning": row["reasoning"],
        "token_ids": ids,
        **{name: row[name] for name in TOOL_FIELDS},
    }


@dataclass
class FirstRead:
    """What a prompt reads before it is built, in one database call: the attached
    documents and the history as far as ``first_reach`` (``_first_read``)."""

    docs: AttachedDocuments
    history: HistoryRead
    reach: int


def _first_read(
    conversation: Conversation,
    leaf_id: int | None,
    max_model_len: int,
    fingerprint: str,
    streaming: bool,
    on_path: list[tuple] | None = None,
    in_hand: dict[int, dict] | None = None,
) -> FirstRead:
    """Synchronous: the documents and the first page of history of a prompt."""
    reach = first_reach(max_model_len)
    docs = attached(conversation.pk, conversation.owner_id, max_model_len)
    history = read_history(
        conversation.pk,
        leaf_id,
        fingerprint=fingerprint,
        reach=reach,
        streaming=streaming,
        start_id=conversation.context_start_id,
        on_path=on_path,
        in_hand=in_hand,
    )
    return FirstRead(docs, history, reach)


@dataclass
class AnswerInputs:
    """What an answer's prompt reads before it is built: its conversation, its parent (the
    history's leaf) and the first read, for one engine's context and tokenizer."""

    conversation: Conversation
    parent_id: int | None
    first: FirstRead
    max_model_len: int
    fingerprint: str

    def suits(self, max_model_len: int, fingerprint: str) -> bool:
        return (self.max_model_len, self.fingerprint) == (max_model_len, fingerprint)


def answer_inputs_from_tree(tree: Tree, answer_id: int, engine: AsyncEngine | None) -> AnswerInputs | None:
    """Synchronous, in the database call that created the answer ``answer_id``: its inputs
    from the tree that call loaded and changed under its locks, so the generation need not
    read the message, the conversation and the path again; messages that call wrote (the
    question) are not read back either. None until the engine is loaded and its
    fingerprint known (the generation reads them then)."""
    fingerprint = cached_fingerprint(engine.model_name, engine.tokenizer) if engine is not None else None
    answer = tree.by_id.get(answer_id)
    if not fingerprint or answer is None:
        return None
    conversation, parent_id = tree.conversation, answer.parent_id
    first = _first_read(
        conversation,
        parent_id,
        engine.max_model_len,
        fingerprint,
        True,
        tree_path(tree, parent_id),
        rows_in_tree(tree, parent_id),
    )
    return AnswerInputs(conversation, parent_id, first, engine.max_model_len, fingerprint)


def rows_in_tree(tree: Tree, leaf_id: int | None) -> dict[int, dict]:
    """The rows ``_rows`` would read of the path to ``leaf_id`` whose every field the tree
    holds: the messages written in this call (``Tree.load`` leaves the token ids out)."""
    leaf = tree.by_id.get(leaf_id) if leaf_id is not None else None
    if leaf is None or not tree.written:
        return {}
    return {
        m.pk: {name: getattr(m, name) for name in ROW_FIELDS}
        for m in tree.path_to(leaf)
        if m.pk in tree.written
    }


async def _fingerprint(engine: AsyncEngine) -> str:
    """The engine's token fingerprint; worked out off the event loop the first time."""
    known = cached_fingerprint(engine.model_name, engine.tokenizer)
    return known or await asyncio.to_thread(token_fingerprint, engine.model_name, engine.tokenizer)


async def plan_prompt(
    conversation: Conversation,
    leaf_id: int | None,
    engine: AsyncEngine,
    *,
    add_generation_prompt: bool = True,
    streaming: bool = True,
    keep_start: bool = False,
    tools: ToolPrompt | None = None,
    first: FirstRead | None = None,
) -> PlannedPrompt:
    """The prompt for the thread ending at ``leaf_id`` on ``engine``: rows read in short
    database calls, the prompt built off the database thread (see the module docstring).
    It starts where ``conversation.context_start`` says while that fits; ``keep_start``
    stores where it starts now; ``tools``: how calls, results and the offered tools are
    rendered (``conversations.chat.tool_loop``); ``first``: the first read, if made already
    (with the same ``streaming``). Raises ``PromptTooLongError`` like ``build_prompt``."""
    tokenizer, max_model_len = engine.tokenizer, engine.max_model_len
    fingerprint = await _fingerprint(engine)
    start_id = conversation.context_start_id
    if first is None:
        first = await database_sync_to_async(_first_read)(
            conversation, leaf_id, max_model_len, fingerprint, streaming
        )
    # Attached documents: whole ones lead the system message, others are searched per question.
    docs, history, reach = first.docs, first.history, first.reach
    system_prompt = docs.system_prompt(conversation.system_prompt)
    while True:
        if add_generation_prompt:
            await ground_question(conversation, history.messages, docs)
        try:
            plan = await asyncio.to_thread(
                build_prompt,
                tokenizer,
                system_prompt,
                history.messages,
                max_model_len,
                conversation.max_tokens,
                earlier=history.earlier,
                add_generation_prompt=add_generation_prompt,
                start_id=start_id,
                tools=tools,
            )
        except NeedEarlierHistory:
            reach *= 4
            history = await database_sync_to_async(read_history)(
                conversation.pk,
                leaf_id,
                fingerprint=fingerprint,
                reach=reach,
                streaming=streaming,
                start_id=start_id,
            )
            continue
        if docs.whole:  # the user's documents: salted from the first token
            plan.shared_prefix_tokens = 0
        if keep_start and plan.start_id != start_id:
            await _save_start(conversation, plan.start_id)
        return PlannedPrompt(conversation, history, plan, fingerprint)


def one(queryset):
    """The first row of a query that matches one row at most (a primary key's), or None:
    without ``first()``'s ordering, whose compilation costs more than the query runs."""
    return next(iter(queryset.order_by()[:1]), None)


@database_sync_to_async
def _save_start(conversation: Conversation, start_id: int | None) -> None:
    # update(): no save signals, and updated_at (the list's order) stays as it was.
    Conversation.all_objects.filter(pk=conversation.pk).update(context_start_id=start_id)
    conversation.context_start_id = start_id


@database_sync_to_async
def _answer_inputs(message_id: int, max_model_len: int, fingerprint: str) -> AnswerInputs | None:
    row = one(Message.objects.filter(pk=message_id).values_list("conversation_id", "parent_id"))
    if row is None:
        return None
    conversation = one(Conversation.all_objects.filter(pk=row[0]))
    if conversation is None:
        return None
    first = _first_read(conversation, row[1], max_model_len, fingerprint, True)
    return AnswerInputs(conversation, row[1], first, max_model_len, fingerprint)


async def answer_prompt(
    message_id: int,
    engine: AsyncEngine,
    tools_for: Callable[..., Awaitable[ToolPrompt | None]] | None = None,
    inputs: AnswerInputs | None = None,
) -> PlannedPrompt | None:
    """The prompt for the answer ``message_id`` (its history ends with its parent), or
    None if the answer is gone. ``tools_for(conversation, history, engine)``: the tools
    to render, if any; ``inputs``: read already (``answer_inputs_from_tree``), used if
    made for this engine."""
    fingerprint = await _fingerprint(engine)
    if inputs is None or not inputs.suits(engine.max_model_len, fingerprint):
        inputs = await _answer_inputs(message_id, engine.max_model_len, fingerprint)
    if inputs is None:
        return None
    conversation, parent_id, first = inputs.conversation, inputs.parent_id, inputs.first
    tools = await tools_for(conversation, first.history, engine) if tools_for is not None else None
    return await plan_prompt(conversation, parent_id, engine, keep_start=True, tools=tools, first=first)


@database_sync_to_async
def _thread_inputs(
    conversation_id: int, max_model_len: int, fingerprint: str, empty: bool
) -> tuple[Conversation, int | None, FirstRead] | None:
    conversation = one(Conversation.objects.filter(pk=conversation_id))
    if conversation is None:
        return None
    leaf_id = conversation.current_leaf_id
    if leaf_id is None:  # no leaf recorded: the one the thread shows
        leaf = Tree.load(conversation).leaf()
        leaf_id = leaf.pk if leaf is not None else None
    if leaf_id is None and not empty:
        return None
    return conversation, leaf_id, _first_read(conversation, leaf_id, max_model_len, fingerprint, False)


async def thread_prompt(
    conversation_id: int, engine: AsyncEngine, empty: bool = True
) -> PlannedPrompt | None:
    """What the conversation's next prompt will start with: its visible thread as it stands
    (no streaming answer, no generation prompt), cut to the context as a prompt would be.
    None if the conversation is gone, or with ``empty`` False, if it has no message."""
    inputs = await _thread_inputs(conversation_id, engine.max_model_len, await _fingerprint(engine), empty)
    if inputs is None:
        return None
    conversation, leaf_id, first = inputs
    return await plan_prompt(
        conversation, leaf_id, engine, add_generation_prompt=False, streaming=False, first=first
    )
