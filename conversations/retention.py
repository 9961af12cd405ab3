"""Conversation-aware KV retention: the histories of conversations open in a tab stay warm.

A user with the conversation on screen is the likeliest to send the next turn, so while
at least one tab of this process shows a conversation, the token ids of its visible
thread are marked in the engine (``engine.retain``): their KV blocks are evicted last,
and to the next tier, never dropped. When the last tab leaves, the mark is released.
The mark is refreshed when an answer finishes (the history grew).

The consumer calls ``switch`` (a tab now shows another conversation, or none) and
``on_event`` (every event it sends); both return at once and
do their work in a task, and do nothing until this process's engine is loaded (opening
a conversation never loads the model). With several processes the engine belongs to one
owner process: ``_engine()`` is the place a proxy to it plugs in (it must offer
``retain``/``release``, as ``AsyncEngine`` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from channels.db import database_sync_to_async

log = logging.getLogger(__name__)


def retention_key(conversation_id: int) -> str:
    return f"conversation:{conversation_id}"


def _engine() -> Any | None:
    from conversations import engine  # noqa: PLC0415 - read the live module state

    return engine._engine


@database_sync_to_async
def history_token_ids(conversation_id: int, tokenizer: Any) -> tuple[list[int], dict[str, Any]]:
    """The ids the next turn's prompt will start with: the visible thread rendered with
    stored ids (as generation renders it), without a trailing generation prompt, and the
    cache-salt options its requests use. Empty when the template cannot promise that
    prefix (``exact`` is False)."""
    from conversations.generation import _chat_messages, cache_salt_options  # noqa: PLC0415
    from conversations.models import Conversation, Message  # noqa: PLC0415
    from conversations.tree import Tree  # noqa: PLC0415

    try:
        conversation = Conversation.objects.get(pk=conversation_id)
    except Conversation.DoesNotExist:
        return [], {}
    # The messages generation would put in the next prompt (a streaming answer's are not final).
    thread = [
        m
        for m in Tree.load(conversation).thread()
        if m.status not in (Message.Status.ERROR, Message.Status.STREAMING)
        and (m.content or m.role != Message.Role.ASSISTANT)
    ]
    if not thread:
        return [], {}
    stored = dict(Message.objects.filter(pk__in=[m.pk for m in thread]).values_list("pk", "token_ids"))
    history = [{"role": m.role, "content": m.content, "token_ids": stored.get(m.pk)} for m in thread]
    encoding = tokenizer.encode_chat_segments(
        _chat_messages(conversation.system_prompt, history), add_generation_prompt=False
    )
    if not encoding.exact:
        return [], {}
    shared = len(encoding.segments[0]) if conversation.system_prompt else 0
    ids = [t for segment in encoding.segments for t in segment]
    return ids, cache_salt_options(conversation.owner_id, shared)


class ConversationRetention:
    """Per process: how many tabs show each conversation, and the marks in the engine."""

    def __init__(self) -> None:
        self.tabs: dict[int, int] = defaultdict(int)
        self._tasks: set[asyncio.Task] = set()

    def switch(self, previous: int | None, current: int | None) -> None:
        """A tab moved from ``previous`` to ``current`` (either may be None)."""
        if previous == current:
            return
        if previous is not None:
            self.unwatch(previous)
        if current is not None:
            self.watch(current)

    def watch(self, conversation_id: int) -> None:
        self.tabs[conversation_id] += 1
        if self.tabs[conversation_id] == 1:
            self._spawn(self.refresh(conversation_id))

    def unwatch(self, conversation_id: int) -> None:
        if self.tabs.get(conversation_id, 0) <= 0:
            return
        self.tabs[conversation_id] -= 1
        if not self.tabs[conversation_id]:
            del self.tabs[conversation_id]
            engine = _engine()
            if engine is not None:
                engine.release(retention_key(conversation_id))

    def on_event(self, conversation_id: int | None, event: dict) -> None:
        """An answer finished in an open conversation: retain the longer history."""
        if event.get("type") == "finished" and conversation_id in self.tabs:
            self._spawn(self.refresh(conversation_id))

    async def refresh(self, conversation_id: int) -> None:
        engine = _engine()
        if engine is None:
            return
        try:
            ids, salt = await history_token_ids(conversation_id, engine.tokenizer)
        except Exception:  # retention is an optimisation: never break the chat for it
            log.warning("could not read conversation %s for KV retention", conversation_id, exc_info=True)
            return
        if conversation_id not in self.tabs:
            return  # closed meanwhile
        if ids:
            engine.retain(retention_key(conversation_id), ids, **salt)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


_per_loop: dict[asyncio.AbstractEventLoop, ConversationRetention] = {}


def get_retention() -> ConversationRetention:
    """This event loop's tracker (one per Daphne process, like the generation manager)."""
    loop = asyncio.get_running_loop()
    retention = _per_loop.get(loop)
    if retention is None:
        for closed in [other for other in _per_loop if other.is_closed()]:
            del _per_loop[closed]
        retention = _per_loop[loop] = ConversationRetention()
    return retention
