"""Answers generated independently of any one websocket.

One :class:`GenerationManager` per event loop (one per Daphne process) runs every
answer as its own ``asyncio`` task. Sockets come and go as *watchers* of a
conversation:

- **Fan-out.** Each delta is pushed, in-process and without awaiting, to every watcher
  of the conversation (each consumer forwards them over its own socket). A watcher that
  joins mid-answer gets the text so far first, then the live deltas; both happen on the
  event loop's thread, so nothing is lost or repeated in between.
- **Grace.** When the last watcher of a conversation leaves, a timer of
  ``GENERATION_GRACE_SECONDS`` starts for each of its live answers; a watcher coming
  back cancels it. When it fires the engine request is aborted and the partial answer
  saved as ``interrupted``.
- **Partial saves.** One task writes the text so far of every live answer every
  ``PARTIAL_SAVE_SECONDS``, in one database call (and touches a row now and then even
  without new text), so a crash loses at most that much; an untouched ``streaming`` row
  that no live generation owns is shown as interrupted (``conversations.chat.answer_rows``).
  The final save follows the last partial one: both go through the one database thread
  (final saves close together in one call: ``conversations.chat.final_saves``).
- **The fence.** A write that matches no row this process owns (``answer_rows``) stops the
  answer (``fenced``) without another write or group event.
- **The lifecycle.** The records are typed (``conversations.chat.records``: an ``Answer``, a
  ``ToolRun``); every move of one, and every write of a row's status, goes through
  ``conversations.chat.lifecycle``.
- **Other processes.** With several processes (``conversations.cluster.registry``) each live answer
  has one owner, recorded in ``Message.owner_process``. The owner's relay task sends the
  new text and reasoning to the conversation's group at most ``RELAY_HZ`` times a second,
  each with its character offset, so tabs in other processes show the same text and
  thinking (and ask the owner for a snapshot should they miss a piece); when nothing was
  sent for ``STREAM_HEARTBEAT_SECONDS`` it sends a ``heartbeat`` instead, to local tabs
  too. The grace period runs only while no tab in any process shows the conversation.
- **Tools.** With tools on, an answer may end with tool calls: they and their results go on as
  nodes of the tree, each a live generation here too (``conversations.chat.tool_loop``).
- **Coarse events** (an answer started or finished, the tree or the list changed) go
  through the channel layer's groups (``conversations.chat.groups``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

from conversations.accounts import quota
from conversations.chat import lifecycle, titles, tool_loop
from conversations.chat.answer_deltas import AnswerDeltas
from conversations.chat.answer_rows import store_user_segment
from conversations.chat.answer_tasks import (
    RELAY_HZ,
    STREAM_HEARTBEAT_SECONDS,
    PartialSaves,
    Relays,
    relay_piece,
)
from conversations.chat.final_saves import FinalSaves
from conversations.chat.model_choice import answer_engine
from conversations.chat.prompt_history import answer_prompt
from conversations.chat.prompts import cache_salt_options, engine_options
from conversations.chat.records import Answer, LiveNode, StopReason, ToolRun, ToolStep
from conversations.chat.retention import get_retention
from conversations.cluster import registry as cluster
from conversations.models import Message
from conversations.ops.db_thread import db_call
from conversations.ops.engine_handle import EngineLoadError
from conversations.usage import record as usage_record

if TYPE_CHECKING:
    from conversations.chat.prompt_history import AnswerInputs

log = logging.getLogger(__name__)

STOP_FALLBACK_SECONDS = 5.0


class Watcher(Protocol):
    def push(self, event: dict) -> None:
        """Take an event without blocking (a consumer queues it for its socket)."""


class GenerationManager:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.generations: dict[int, Answer | ToolRun] = {}
        # conversation id -> its live generations (message id -> its record), as ``generations``
        self._by_conversation: dict[int, dict[int, Answer | ToolRun]] = defaultdict(dict)
        self.watchers: dict[int, set[Watcher]] = defaultdict(set)
        self.background: set[asyncio.Task] = set()
        self.process_tasks: list[asyncio.Task] = []  # conversations.cluster.process_loop, if started
        self.partials = PartialSaves(self.stop)
        self.final_saves = FinalSaves()
        self.relays = Relays(self)

    # Watchers ----------------------------------------------------------------------
    def watch(self, conversation_id: int, watcher: Watcher) -> None:
        self.watchers[conversation_id].add(watcher)
        for gen in self.live_in(conversation_id):
            self._cancel_grace(gen)

    def unwatch(self, conversation_id: int, watcher: Watcher) -> None:
        watchers = self.watchers.get(conversation_id)
        if watchers is None:
            return
        watchers.discard(watcher)
        if not watchers:
            del self.watchers[conversation_id]
            for gen in self.live_in(conversation_id):
                self.check_grace(gen)

    def check_grace(self, gen: LiveNode) -> None:
        """With no tab here, run the grace period unless a tab in another process shows the
        conversation (asked of Redis; the process loop repeats this every few seconds)."""
        if self.watcher_count(gen.conversation_id):
            self._cancel_grace(gen)
        elif not cluster.enabled():
            if gen.grace_handle is None:
                self._schedule_grace(gen)
        else:
            task = self.loop.create_task(self._check_remote_watchers(gen))
            self.background.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self.background.discard)

    async def _check_remote_watchers(self, gen: LiveNode) -> None:
        try:
            elsewhere = await cluster.watched_elsewhere(gen.conversation_id)
        except Exception:
            log.warning("cannot read the watchers of %s", gen.conversation_id, exc_info=True)
            elsewhere = False
        if gen.message_id not in self.generations or self.watcher_count(gen.conversation_id):
            return
        if elsewhere:
            self._cancel_grace(gen)
        elif gen.grace_handle is None:
            self._schedule_grace(gen)

    def watcher_count(self, conversation_id: int) -> int:
        return len(self.watchers.get(conversation_id, ()))

    def emit(self, conversation_id: int, event: dict) -> None:
        for watcher in list(self.watchers.get(conversation_id, ())):
            try:
                watcher.push(event)
            except Exception:
                log.exception("a watcher refused an event")

    # Queries -----------------------------------------------------------------------
    def live_in(self, conversation_id: int) -> list[Answer | ToolRun]:
        live = self._by_conversation.get(conversation_id)
        return list(live.values()) if live else []

    def get(self, message_id: int) -> Answer | ToolRun | None:
        return self.generations.get(message_id)

    def live_reasoning(self, message_id: int) -> str | None:
        gen = self.generations.get(message_id)
        return gen.reasoning.text if gen is not None else None

    def live_text(self, message_id: int) -> str | None:
        gen = self.generations.get(message_id)
        return gen.text if gen is not None else None

    # Control -----------------------------------------------------------------------
    def start_answer(
        self, *, conversation_id: int, owner_id: int, message_id: int, inputs: AnswerInputs | None = None
    ) -> Answer:
        """Generate the answer ``message_id`` (a ``streaming`` row already in the tree).
        ``inputs``: the prompt's first read, if its creation made it."""
        live = self.generations.get(message_id)
        if isinstance(live, Answer):
            return live
        answer = Answer(message_id, conversation_id, owner_id, f"chat-{message_id}-{uuid.uuid4().hex[:8]}")
        self._add(answer, self._run_answer(answer, inputs))
        return answer

    def start_tool_step(
        self, *, conversation_id: int, owner_id: int, message_id: int, step: ToolStep
    ) -> ToolRun:
        """Work on the ``tool`` node ``message_id`` (a ``streaming`` row already in the tree)."""
        live = self.generations.get(message_id)
        if isinstance(live, ToolRun):
            return live
        run = ToolRun(
            message_id, conversation_id, owner_id, f"tool-{message_id}-{uuid.uuid4().hex[:8]}", step=step
        )
        lifecycle.start_tool_step(run)
        self._add(run, tool_loop.run_step(self, run))
        return run

    def _add(self, node: Answer | ToolRun, work: Coroutine[object, object, None]) -> None:
        self.generations[node.message_id] = node
        self._by_conversation[node.conversation_id][node.message_id] = node
        node.task = self.loop.create_task(work, name=node.request_id)
        self.relays.add(node)
        if not self.watcher_count(node.conversation_id):
            self.check_grace(node)

    def stop(self, message_id: int, reason: str = StopReason.USER) -> bool:
        """Abort the answer (the engine frees it within a step); the text so far is kept."""
        node = self.generations.get(message_id)
        if node is None:
            return False
        if node.stop_reason is None:
            node.stop_reason = reason
        self._cancel_grace(node)
        if isinstance(node, ToolRun):
            tool_loop.stop_step(node)
            return True
        if node.engine is not None:
            try:
                node.engine.abort(node.request_id)
            except Exception:
                log.exception("engine.abort failed")
        # Should the engine never answer, stop waiting for it.
        self.loop.call_later(STOP_FALLBACK_SECONDS, self._force_cancel, node)
        return True

    def decide(self, message_id: int, approved: bool) -> bool:
        """Approve or deny the call of ``tool`` node ``message_id``; False if none waits here."""
        return tool_loop.decide(self, message_id, approved)

    def forget(self, node: LiveNode) -> None:
        """``node`` is done (its final save was made): no longer live here."""
        node.done.set()
        self._drop(node)
        self._cancel_grace(node)
        self.relays.discard(node)

    def _drop(self, node: LiveNode) -> None:
        if self.generations.get(node.message_id) is node:
            del self.generations[node.message_id]
        live = self._by_conversation.get(node.conversation_id)
        if live is not None and live.get(node.message_id) is node:
            del live[node.message_id]
            if not live:
                del self._by_conversation[node.conversation_id]

    def stop_conversation(self, conversation_id: int, reason: str = StopReason.DELETED) -> None:
        for node in self.live_in(conversation_id):
            self.stop(node.message_id, reason)

    def _force_cancel(self, node: LiveNode) -> None:
        if node.task is not None and not node.task.done() and not node.done.is_set():
            node.task.cancel()

    def _schedule_grace(self, node: LiveNode) -> None:
        self._cancel_grace(node)
        node.grace_handle = self.loop.call_later(
            settings.GENERATION_GRACE_SECONDS, self.stop, node.message_id, StopReason.GRACE
        )

    def _cancel_grace(self, node: LiveNode) -> None:
        if node.grace_handle is not None:
            node.grace_handle.cancel()
            node.grace_handle = None

    # The task ----------------------------------------------------------------------
    async def _run_answer(self, answer: Answer, inputs: AnswerInputs | None) -> None:
        error = ""
        timing: dict[str, float] = {"started": time.monotonic()}
        try:
            await self._generate(answer, timing, inputs)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            answer.stop_reason = answer.stop_reason or StopReason.CANCELLED
        except Exception as exc:
            error = failure_text(exc, answer)
        finally:
            answer.done.set()
            self.partials.discard(answer)
        await self._finish(answer, error, timing)
        if not error:
            await tool_loop.after_answer(self, answer)

    async def _generate(self, answer: Answer, timing: dict[str, float], inputs: AnswerInputs | None) -> None:
        """Build the prompt and stream the answer into ``answer``, saved now and then."""
        from inference import SamplingParams

        engine, adapter, model_id = await answer_engine(answer.message_id)
        answer.engine = engine
        # Built off the database thread, with the tools if the conversation has them on.
        tools_for = tool_loop.PromptTools(answer.owner_id)
        prompt = await answer_prompt(answer.message_id, engine, tools_for, inputs)
        answer.tools = tools_for.chosen
        if prompt is None:
            answer.stop_reason = answer.stop_reason or StopReason.DELETED
            return
        conversation, history, plan = prompt.conversation, prompt.history.messages, prompt.plan
        answer.fingerprint = prompt.fingerprint
        params = SamplingParams(
            temperature=conversation.temperature,
            top_p=conversation.top_p,
            top_k=conversation.top_k,
            max_tokens=plan.max_tokens,
            separate_reasoning=True,
        )
        answer.prompt_tokens, answer.dropped = len(plan.token_ids), plan.dropped
        if plan.exact and not plan.dropped:
            answer.prompt_ids = plan.token_ids
        answer.cache_options = cache_salt_options(answer.owner_id, plan.shared_prefix_tokens)
        if plan.user_segment and history:
            await store_user_segment(history[-1]["id"], plan.user_segment, answer.fingerprint)
        # Written with every save of the row (no write of their own): a row this process no
        # longer owns stops the answer at its first partial save.
        answer.start_fields = {
            "prompt_tokens": answer.prompt_tokens,
            "context_dropped": plan.dropped,
            "model_name": model_id[:200],
        }
        if answer.stop_reason:
            return
        started = {
            "message_id": answer.message_id,
            "context_dropped": plan.dropped,
            "prompt_tokens": answer.prompt_tokens,
        }
        await lifecycle.start_streaming(self, answer, started)
        self.partials.add(answer)
        admitted = await quota_admission(answer.owner_id, len(plan.token_ids))
        answer.quota_gate = admitted.gate
        options = {**engine_options(answer.owner_id, plan, answer.cache_options), **admitted.engine_options()}
        if adapter is not None:
            options["adapter"] = adapter
        deltas = AnswerDeltas(answer, timing, self.emit, self.relays.poke)
        engine.submit(plan.token_ids, params, deltas, answer.request_id, **options)
        try:
            await deltas.done
        finally:
            deltas.close()
            if not deltas.request_finished:
                engine.abort(answer.request_id)
        tool_loop.split_calls(answer)

    async def _finish(self, answer: Answer, error: str, timing: dict[str, float]) -> None:
        """The final save, then the news to the watchers and the group (``lifecycle``)."""
        now = time.monotonic()
        first = timing.get("first_token")
        count = len(answer.token_ids)
        fields = {
            "content": answer.text,
            **answer.reasoning.message_fields(now),
            "completion_tokens": count,
            "cached_tokens": answer.cached_tokens,
            "time_to_first_token_ms": (first - timing["started"]) * 1000 if first else None,
            "tokens_per_s": count / (now - first) if first and count > 1 and now > first else None,
            **tool_loop.answer_fields(answer),
        }
        stored = {
            **answer.start_fields,
            "token_ids": answer.token_ids or None,
            "token_fingerprint": answer.fingerprint,
        }

        def forget() -> None:
            self._drop(answer)
            self._cancel_grace(answer)
            self.relays.discard(answer)

        async def before_announce(status: str) -> None:
            if cluster.enabled():
                # The last piece, so that relayed deltas add up to the final text everywhere.
                await relay_piece(answer)
            prefix = _next_turn_prefix(answer, status)
            # Before the watchers hear of it: their retention then reads nothing.
            if prefix and answer.engine is not None:
                get_retention().answered(
                    answer.conversation_id, answer.message_id, prefix, answer.cache_options, answer.engine
                )

        status = await lifecycle.end_answer(
            self,
            answer,
            error=error,
            fields=fields,
            stored=stored,
            save=self.final_saves.save,
            forget=forget,
            before_announce=before_announce,
        )
        if status is not None:
            titles.answer_finished(answer.conversation_id, answer.message_id, status)
            await add_usage(
                usage_record.Finished(
                    user_id=answer.owner_id,
                    model=str(answer.start_fields.get("model_name", "")),
                    source="chat",
                    prompt_tokens=answer.prompt_tokens,
                    completion_tokens=count,
                    cached_tokens=answer.cached_tokens,
                    ttft_ms=fields["time_to_first_token_ms"],
                )
            )
        if answer.quota_gate is not None:
            await self._settle_quota(answer, answer.quota_gate)

    async def _settle_quota(self, answer: Answer, gate: quota.QuotaGate) -> None:
        """The cached-prompt discount given back; an answer the budget stopped gets a notice
        (and its audit entry)."""
        await asyncio.to_thread(quota.settle_cached, gate, answer.cached_tokens)
        if gate.exhausted is None:
            return
        await quota_stopped(answer.owner_id, gate.exhausted)
        notice = quota.describe(gate.exhausted) + " The answer stopped there."
        self.emit(
            answer.conversation_id,
            {
                "type": "notice",
                "conversation_id": answer.conversation_id,
                "message_id": answer.message_id,
                "code": "quota_exhausted",
                "text": notice,
            },
        )


quota_admission = db_call(quota.admission)
add_usage = db_call(usage_record.add)


@db_call
def quota_stopped(user_id: int, counter: quota.Counter) -> None:
    quota.note_exhausted(user_id, counter, "stopped")


def failure_text(exc: Exception, answer: Answer) -> str:
    """What the tab is told of an answer that failed with ``exc`` (empty: not a failure)."""
    from inference import EngineOverloadedError, InvalidPromptError, PromptTooLongError

    if isinstance(exc, quota.Exhausted):
        return str(exc)
    if isinstance(exc, PromptTooLongError):
        return (
            f"This message is too long for the model: the prompt needs {exc.num_tokens} tokens "
            f"and the context has room for {exc.limit}. Shorten it or start a new chat."
        )
    if isinstance(exc, InvalidPromptError):
        # Token ids stored under another model (ENGINE_MODEL changed): this answer fails, no other.
        return (
            f"This conversation holds a token the current model does not know ({exc.token_id}; "
            f"its vocabulary has {exc.vocab_size}), probably from an earlier model. Start a new chat."
        )
    if isinstance(exc, EngineLoadError):
        return f"The model is not available: {exc}."
    if isinstance(exc, EngineOverloadedError):
        return "The server is busy (too many answers are waiting). Please try again in a moment."
    if isinstance(exc, ValueError):
        return f"These settings cannot be used: {exc}."
    if answer.stop_reason == StopReason.SHUTDOWN:  # then the engine, stopping too, fails the request
        return ""
    log.exception("generation %s failed", answer.request_id)
    return f"The answer failed: {type(exc).__name__}: {exc}"


def _next_turn_prefix(answer: Answer, status: str) -> list[int]:
    """The ids the conversation's next prompt starts with, known without rendering it: this
    answer's prompt and its generated ids (the template renders a stored answer as the
    generation prompt, the ids and its end of turn). Empty where that does not hold or is
    not known: no exact prompt, a failed answer, reasoning (left out of later prompts),
    tools (rendered in the tools' format)."""
    if answer.prompt_ids is None or not answer.token_ids or status == Message.Status.ERROR:
        return []
    if answer.reasoning.text or answer.tools is not None or answer.tool_calls:
        return []
    return answer.prompt_ids + answer.token_ids


__all__ = ["RELAY_HZ", "STREAM_HEARTBEAT_SECONDS", "Answer", "GenerationManager", "ToolRun"]
