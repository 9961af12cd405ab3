"""Conversation-aware KV retention: the histories of conversations open in a tab stay warm.

A user with the conversation on screen is the likeliest to send the next turn, so while
at least one tab of this process shows a conversation, the token ids of its visible
thread are marked in the engine (``engine.retain``): their KV blocks are evicted last,
and to the next tier, never dropped. When the last tab leaves, the mark is released.
The mark is refreshed when an answer finishes (the history grew).

The consumer calls ``switch`` (a tab now shows another conversation, or none) and
``on_event`` (each ``finished`` event it sends); both return at once and do their work in a task,
and do nothing until the marking process's engine is loaded (opening a conversation
never loads the model).

With several processes (``conversations.cluster.registry``) the KV blocks live in the process that
generated the conversation's latest answer (:func:`last_owner`), where its next turn is
routed too. The mark is made there: this process sends that owner ``chat.retain`` /
``chat.release`` (``conversation_id``, ``origin``: this process) and the owner's process
loop calls :meth:`ConversationRetention.retain_for` / ``release_for``, which read the
history and mark it under a key naming the origin, so tabs of several processes hold
independent marks. The local engine is marked instead when the site is one process, the
owner is this process or none, or the owner is gone; the owner drops the marks of an
origin that died (its release never comes) in ``forget_processes``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async

from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID

if TYPE_CHECKING:
    from inference import AsyncEngine

log = logging.getLogger(__name__)


def retention_key(conversation_id: int, origin: str | None = None) -> str:
    """The engine key of a conversation's mark; ``origin``: the process whose tabs asked
    for it, when that is not the engine's own process."""
    key = f"conversation:{conversation_id}"
    return f"{key}@{origin}" if origin and origin != PROCESS_ID else key


@database_sync_to_async
def latest_answer_model(conversation_id: int) -> str:
    """The model id that wrote the conversation's latest answer ("" for none)."""
    from conversations.models import Message  # noqa: PLC0415

    found = (
        Message.objects.filter(conversation_id=conversation_id, role=Message.Role.ASSISTANT)
        .order_by("-created_at", "-id")
        .values_list("model_name", flat=True)
        .first()
    )
    return found or ""


async def holding_engine(conversation_id: int) -> AsyncEngine | None:
    """The loaded engine holding the conversation's KV: that of the model which wrote its
    latest answer (each model has its own engine and pool), the default model's when none
    did. None while that engine is not loaded (a mark never loads a model)."""
    from conversations.chat.model_choice import loaded_engine  # noqa: PLC0415 - it imports the tree

    return await loaded_engine(await latest_answer_model(conversation_id))


@database_sync_to_async
def last_owner(conversation_id: int) -> str | None:
    """The process that generated the conversation's latest answer (its KV is there)."""
    from conversations.models import Message  # noqa: PLC0415

    return (
        Message.objects.filter(conversation_id=conversation_id, role=Message.Role.ASSISTANT)
        .exclude(owner_process="")
        .order_by("-created_at", "-id")
        .values_list("owner_process", flat=True)
        .first()
    )


async def kv_holder(conversation_id: int) -> cluster.ProcessInfo | None:
    """The live process other than this one whose engine holds the conversation's KV, or
    None to mark this process's engine (one process, no owner yet, or the owner gone)."""
    if not cluster.enabled():
        return None
    owner = await last_owner(conversation_id)
    if not owner or owner == PROCESS_ID:
        return None
    info = (await cluster.live_processes()).get(owner)
    return info if info is not None and info.channel else None


async def history_token_ids(conversation_id: int, engine: AsyncEngine) -> tuple[list[int], dict[str, Any]]:
    """The ids the next turn's prompt will start with: the visible thread rendered with
    stored ids and cut to the context (as generation renders it), without a trailing
    generation prompt, and the cache-salt options its requests use. Empty when the template
    cannot promise that prefix. Rows are read in short database calls and the ids built in a
    worker thread (``conversations.chat.prompt_history``): opening a tab never renders a
    prompt on the database thread."""
    from conversations.chat.prompt_history import thread_prompt  # noqa: PLC0415
    from conversations.chat.prompts import cache_salt_options  # noqa: PLC0415
    from inference import PromptTooLongError  # noqa: PLC0415

    try:
        prompt = await thread_prompt(conversation_id, engine, empty=False)
    except PromptTooLongError:
        return [], {}
    if prompt is None or not prompt.history.messages or not prompt.plan.exact:
        return [], {}
    salt = cache_salt_options(prompt.conversation.owner_id, prompt.plan.shared_prefix_tokens)
    return prompt.plan.token_ids, salt


class ConversationRetention:
    """Per process: how many tabs show each conversation and where each one's mark is;
    and, as an owner, the marks made here for other processes' tabs."""

    def __init__(self) -> None:
        self.tabs: dict[int, int] = defaultdict(int)
        self.placed: dict[int, str] = {}  # conversation id -> process holding its mark
        self.remote: dict[str, set[int]] = defaultdict(set)  # origin -> conversations marked here
        # conversation id -> the answer whose own ids made its mark (``answered``)
        self.marked_by_answer: dict[int, int] = {}
        # mark key -> the engine holding it (each model has its own), so its release goes there
        self.marked_in: dict[str, AsyncEngine] = {}
        self._tasks: set[asyncio.Task] = set()
        # One message to an owner at a time, in order: a release sent while its retain is
        # still on the way must not overtake it (that mark would never be released).
        self._sending = asyncio.Lock()

    def switch(self, previous: int | None, current: int | None, mark: bool = True) -> bool:
        """A tab moved from ``previous`` to ``current`` (either may be None). True if it is
        the first tab here to show ``current``: its mark is made now, or with ``mark`` False
        when the caller calls ``mark_soon`` (having seen that the thread is not empty)."""
        if previous == current:
            return False
        if previous is not None:
            self.unwatch(previous)
        return self.watch(current, mark) if current is not None else False

    def watch(self, conversation_id: int, mark: bool = True) -> bool:
        self.tabs[conversation_id] += 1
        first = self.tabs[conversation_id] == 1
        if first and mark:
            self.mark_soon(conversation_id)
        return first

    def mark_soon(self, conversation_id: int) -> None:
        """Mark the history of a conversation a tab here shows, in a task."""
        if conversation_id in self.tabs:
            self._spawn(self.refresh(conversation_id))

    def unwatch(self, conversation_id: int) -> None:
        if self.tabs.get(conversation_id, 0) <= 0:
            return
        self.tabs[conversation_id] -= 1
        if not self.tabs[conversation_id]:
            del self.tabs[conversation_id]
            self.marked_by_answer.pop(conversation_id, None)
            self._release_at(conversation_id, self.placed.pop(conversation_id, PROCESS_ID))

    def on_event(self, conversation_id: int | None, event: dict) -> None:
        """An answer finished in an open conversation: retain the longer history."""
        if event.get("type") != "finished" or conversation_id not in self.tabs:
            return
        if self.marked_by_answer.get(conversation_id) != event["message"].get("id"):
            self._spawn(self.refresh(conversation_id))

    def answered(
        self, conversation_id: int, message_id: int, token_ids: list[int], options: dict, engine: AsyncEngine
    ) -> bool:
        """An answer generated here finished in a conversation a tab here shows: mark its
        prompt and answer ids, whose KV this engine has just computed, without reading and
        rendering the history again (the caller passes them only where they are how the
        next turn's prompt starts: the template keeps earlier turns, nothing was cut, no
        reasoning or tool calls to render apart). ``on_event`` then leaves that answer be.
        False where the mark belongs elsewhere (another process holds the conversation's KV);
        the history is read for it as before."""
        if conversation_id not in self.tabs or self.placed.get(conversation_id, PROCESS_ID) != PROCESS_ID:
            return False
        self._mark(engine, retention_key(conversation_id), token_ids, options)
        self.placed[conversation_id] = PROCESS_ID
        self.marked_by_answer[conversation_id] = message_id
        return True

    async def refresh(self, conversation_id: int) -> None:
        """Mark the conversation's history where its KV is (moving the mark if an answer
        from another process made that somewhere else)."""
        try:
            holder = await kv_holder(conversation_id)
        except Exception:  # retention is an optimisation: never break the chat for it
            log.warning("cannot find the process holding conversation %s", conversation_id, exc_info=True)
            holder = None
        if conversation_id not in self.tabs:
            return  # closed meanwhile
        where = holder.pid if holder is not None else PROCESS_ID
        previous = self.placed.get(conversation_id)
        if previous is not None and previous != where:
            self._release_at(conversation_id, previous)
        self.placed[conversation_id] = where
        if holder is None:
            await self._retain_here(
                conversation_id, retention_key(conversation_id), lambda: conversation_id in self.tabs
            )
        else:
            await self._tell(holder.pid, "chat.retain", conversation_id)

    # As the owner of other processes' conversations ------------------------------------
    def retain_for(self, conversation_id: int, origin: str) -> None:
        """``chat.retain``: a tab of ``origin`` shows the conversation, whose KV is here."""
        self.remote[origin].add(conversation_id)
        self._spawn(
            self._retain_here(
                conversation_id,
                retention_key(conversation_id, origin),
                lambda: conversation_id in self.remote.get(origin, ()),
            )
        )

    def release_for(self, conversation_id: int, origin: str) -> None:
        """``chat.release``: the last tab of ``origin`` showing the conversation left."""
        marked = self.remote.get(origin)
        if marked is not None:
            marked.discard(conversation_id)
            if not marked:
                del self.remote[origin]
        self._unmark(retention_key(conversation_id, origin))

    def forget_processes(self, live: set[str]) -> None:
        """Release the marks made for processes no longer alive."""
        for origin in [o for o in self.remote if o not in live]:
            for conversation_id in list(self.remote[origin]):
                self.release_for(conversation_id, origin)

    # Helpers ---------------------------------------------------------------------------
    async def _retain_here(self, conversation_id: int, key: str, wanted: Callable[[], bool]) -> None:
        try:
            engine = await holding_engine(conversation_id)
            if engine is None:
                return
            ids, salt = await history_token_ids(conversation_id, engine)
        except Exception:  # retention is an optimisation: never break the chat for it
            log.warning("could not read conversation %s for KV retention", conversation_id, exc_info=True)
            return
        if ids and wanted():  # not released while the history was read
            self._mark(engine, key, ids, salt)

    def _mark(self, engine: AsyncEngine, key: str, token_ids: list[int], options: dict) -> None:
        """Mark ``token_ids`` under ``key`` in ``engine``, moving the mark there from another
        model's engine (the conversation's latest answer came from another model)."""
        previous = self.marked_in.get(key)
        if previous is not None and previous is not engine:
            previous.release(key)
        engine.retain(key, token_ids, **options)
        self.marked_in[key] = engine

    def _unmark(self, key: str) -> None:
        engine = self.marked_in.pop(key, None)
        if engine is not None:
            engine.release(key)

    def _release_at(self, conversation_id: int, where: str) -> None:
        if where != PROCESS_ID:
            self._spawn(self._tell(where, "chat.release", conversation_id))
            return
        self._unmark(retention_key(conversation_id))

    async def _tell(self, pid: str, kind: str, conversation_id: int) -> None:
        """``chat.retain`` / ``chat.release`` to process ``pid`` (if it is still there)."""
        async with self._sending:
            try:
                info = (await cluster.live_processes()).get(pid)
                if info is not None:
                    message = {"type": kind, "conversation_id": conversation_id, "origin": PROCESS_ID}
                    await cluster.send_to_process(info, message)
            except Exception:
                log.warning("cannot send %s to process %s", kind, pid, exc_info=True)

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
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
