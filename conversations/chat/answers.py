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
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings

from conversations.chat import titles, tool_loop
from conversations.chat.answer_deltas import AnswerDeltas
from conversations.chat.answer_rows import store_user_segment, stored_message
from conversations.chat.answer_tasks import (
    RELAY_HZ,
    STREAM_HEARTBEAT_SECONDS,
    PartialSaves,
    Relays,
    relay_piece,
)
from conversations.chat.final_saves import FinalSaves
from conversations.chat.groups import broadcast, conversation_group
from conversations.chat.prompt_history import answer_prompt
from conversations.chat.prompts import cache_salt_options, engine_options
from conversations.chat.reasoning import Reasoning
from conversations.chat.retention import get_retention
from conversations.cluster import registry as cluster
from conversations.models import Message
from conversations.ops.engine_handle import EngineLoadError, aget_engine

log = logging.getLogger(__name__)

STOP_FALLBACK_SECONDS = 5.0


class Watcher(Protocol):
    def push(self, event: dict) -> None:
        """Take an event without blocking (a consumer queues it for its socket)."""


@dataclass(eq=False)
class Generation:
    message_id: int
    conversation_id: int
    owner_id: int
    request_id: str
    text: str = ""
    reasoning: Reasoning = field(default_factory=Reasoning)
    token_ids: list[int] = field(default_factory=list)
    # "user" | "grace" | "deleted" | "shutdown" | "fenced" (not ours any more)
    stop_reason: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    dropped: int = 0
    fingerprint: str = ""  # the tokenizer's, stored with the answer's ids
    # The prompt's ids where the next turn's prompt starts with them and then the answer's
    # (see ``_next_turn_prefix``), with its cache options: for KV retention.
    prompt_ids: list[int] | None = None
    cache_options: dict[str, Any] = field(default_factory=dict)
    task: asyncio.Task | None = None
    grace_handle: asyncio.TimerHandle | None = None
    engine: Any = None
    relayed: int = 0  # characters of text sent to the group so far
    relayed_reasoning: int = 0  # ... of reasoning
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The tool loop (conversations.chat.tool_loop): a ``tool`` node's step; an answer's
    # tool format and offer, and the calls it ended with.
    tool: Any = None
    tools: Any = None
    tool_calls: list[dict] | None = None
    # Its prompt's first read, made where the answer was created (``answer_inputs_from_tree``).
    inputs: Any = None
    start_fields: dict[str, Any] = field(default_factory=dict)  # the prompt's counts, the model


class GenerationManager:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.generations: dict[int, Generation] = {}
        # conversation id -> its live generations (message id -> Generation), as ``generations``
        self._by_conversation: dict[int, dict[int, Generation]] = defaultdict(dict)
        self.watchers: dict[int, set[Watcher]] = defaultdict(set)
        self.background: set[asyncio.Task] = set()
        self.process_tasks: list[asyncio.Task] = []  # conversations.cluster.process_loop, if started
        self.partials = PartialSaves(self)
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

    def check_grace(self, gen: Generation) -> None:
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

    async def _check_remote_watchers(self, gen: Generation) -> None:
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

    def _emit(self, conversation_id: int, event: dict) -> None:
        for watcher in list(self.watchers.get(conversation_id, ())):
            try:
                watcher.push(event)
            except Exception:
                log.exception("a watcher refused an event")

    # Queries -----------------------------------------------------------------------
    def live_in(self, conversation_id: int) -> list[Generation]:
        live = self._by_conversation.get(conversation_id)
        return list(live.values()) if live else []

    def get(self, message_id: int) -> Generation | None:
        return self.generations.get(message_id)

    def live_reasoning(self, message_id: int) -> str | None:
        gen = self.generations.get(message_id)
        return gen.reasoning.text if gen is not None else None

    def live_text(self, message_id: int) -> str | None:
        gen = self.generations.get(message_id)
        return gen.text if gen is not None else None

    # Control -----------------------------------------------------------------------
    def start(
        self, *, conversation_id: int, owner_id: int, message_id: int, tool: Any = None, inputs: Any = None
    ) -> Generation:
        """Generate the answer ``message_id`` (a ``streaming`` row already in the tree), or
        with ``tool`` (a ``tool_loop.ToolStep``) work on the ``tool`` node ``message_id``.
        ``inputs``: the prompt's first read, if its creation made it."""
        if message_id in self.generations:
            return self.generations[message_id]
        gen = Generation(
            message_id=message_id,
            conversation_id=conversation_id,
            owner_id=owner_id,
            request_id=f"chat-{message_id}-{uuid.uuid4().hex[:8]}",
            tool=tool,
            inputs=inputs,
        )
        self.generations[message_id] = gen
        self._by_conversation[conversation_id][message_id] = gen
        gen.task = self.loop.create_task(self._run(gen), name=gen.request_id)
        self.relays.add(gen)
        if not self.watcher_count(conversation_id):
            self.check_grace(gen)
        return gen

    def stop(self, message_id: int, reason: str = "user") -> bool:
        """Abort the answer (the engine frees it within a step); the text so far is kept."""
        gen = self.generations.get(message_id)
        if gen is None:
            return False
        if gen.stop_reason is None:
            gen.stop_reason = reason
        self._cancel_grace(gen)
        if gen.tool is not None:
            tool_loop.stop_step(gen)
            return True
        if gen.engine is not None:
            try:
                gen.engine.abort(gen.request_id)
            except Exception:
                log.exception("engine.abort failed")
        # Should the engine never answer, stop waiting for it.
        self.loop.call_later(STOP_FALLBACK_SECONDS, self._force_cancel, gen)
        return True

    def decide(self, message_id: int, approved: bool) -> bool:
        """Approve or deny the call of ``tool`` node ``message_id``; False if none waits here."""
        return tool_loop.decide(self, message_id, approved)

    def forget(self, gen: Generation) -> None:
        """``gen`` is done (its final save was made): no longer live here."""
        gen.done.set()
        self._drop(gen)
        self._cancel_grace(gen)
        self.relays.discard(gen)

    def _drop(self, gen: Generation) -> None:
        if self.generations.get(gen.message_id) is gen:
            del self.generations[gen.message_id]
        live = self._by_conversation.get(gen.conversation_id)
        if live is not None and live.get(gen.message_id) is gen:
            del live[gen.message_id]
            if not live:
                del self._by_conversation[gen.conversation_id]

    def stop_conversation(self, conversation_id: int, reason: str = "deleted") -> None:
        for gen in self.live_in(conversation_id):
            self.stop(gen.message_id, reason)

    def _force_cancel(self, gen: Generation) -> None:
        if gen.task is not None and not gen.task.done() and not gen.done.is_set():
            gen.task.cancel()

    def _schedule_grace(self, gen: Generation) -> None:
        self._cancel_grace(gen)
        gen.grace_handle = self.loop.call_later(
            settings.GENERATION_GRACE_SECONDS, self.stop, gen.message_id, "grace"
        )

    def _cancel_grace(self, gen: Generation) -> None:
        if gen.grace_handle is not None:
            gen.grace_handle.cancel()
            gen.grace_handle = None

    # The task ----------------------------------------------------------------------
    async def _run(self, gen: Generation) -> None:
        from inference import EngineOverloadedError, InvalidPromptError, PromptTooLongError

        if gen.tool is not None:
            await tool_loop.run_step(self, gen)
            return
        error = ""
        timing: dict[str, float] = {"started": time.monotonic()}
        try:
            await self._generate(gen, timing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            gen.stop_reason = gen.stop_reason or "cancelled"
        except PromptTooLongError as exc:
            error = (
                f"This message is too long for the model: the prompt needs {exc.num_tokens} tokens "
                f"and the context has room for {exc.limit}. Shorten it or start a new chat."
            )
        except InvalidPromptError as exc:
            # Token ids stored under another model (ENGINE_MODEL changed): this answer fails, no other.
            error = (
                f"This conversation holds a token the current model does not know ({exc.token_id}; "
                f"its vocabulary has {exc.vocab_size}), probably from an earlier model. Start a new chat."
            )
        except EngineLoadError as exc:
            error = f"The model is not available: {exc}."
        except EngineOverloadedError:
            error = "The server is busy (too many answers are waiting). Please try again in a moment."
        except ValueError as exc:
            error = f"These settings cannot be used: {exc}."
        except Exception as exc:
            if gen.stop_reason != "shutdown":  # then the engine, stopping too, fails the request
                log.exception("generation %s failed", gen.request_id)
                error = f"The answer failed: {type(exc).__name__}: {exc}"
        finally:
            gen.done.set()
            self.partials.discard(gen)
        await self._finish(gen, error, timing)
        if not error:
            await tool_loop.after_answer(self, gen)

    async def _generate(self, gen: Generation, timing: dict[str, float]) -> None:
        """Build the prompt and stream the answer into ``gen``, saved now and then."""
        from inference import SamplingParams

        engine = gen.engine = await aget_engine()
        # Built off the database thread, with the tools if the conversation has them on.
        prompt = await answer_prompt(gen.message_id, engine, tool_loop.prompt_tools(gen), gen.inputs)
        gen.inputs = None
        if prompt is None:
            gen.stop_reason = gen.stop_reason or "deleted"
            return
        conversation, history, plan = prompt.conversation, prompt.history.messages, prompt.plan
        gen.fingerprint = prompt.fingerprint
        params = SamplingParams(
            temperature=conversation.temperature,
            top_p=conversation.top_p,
            top_k=conversation.top_k,
            max_tokens=plan.max_tokens,
            separate_reasoning=True,
        )
        gen.prompt_tokens, gen.dropped = len(plan.token_ids), plan.dropped
        if plan.exact and not plan.dropped:
            gen.prompt_ids = plan.token_ids
        gen.cache_options = cache_salt_options(gen.owner_id, plan.shared_prefix_tokens)
        if plan.user_segment and history:
            await store_user_segment(history[-1]["id"], plan.user_segment, gen.fingerprint)
        # Written with every save of the row (no write of their own): a row this process no
        # longer owns stops the answer at its first partial save.
        gen.start_fields = {
            "prompt_tokens": gen.prompt_tokens,
            "context_dropped": plan.dropped,
            "model_name": engine.model_name[:200],
        }
        if gen.stop_reason:
            return
        started = {
            "message_id": gen.message_id,
            "context_dropped": plan.dropped,
            "prompt_tokens": gen.prompt_tokens,
        }
        self._emit(
            gen.conversation_id, {"type": "started", "conversation_id": gen.conversation_id, **started}
        )
        await broadcast(conversation_group(gen.conversation_id), "started", **started)
        self.partials.add(gen)
        options = engine_options(gen.owner_id, plan, gen.cache_options)
        deltas = AnswerDeltas(gen, timing, self._emit, self.relays.poke)
        engine.submit(plan.token_ids, params, deltas, gen.request_id, **options)
        try:
            await deltas.done
        finally:
            deltas.close()
            if not deltas.request_finished:
                engine.abort(gen.request_id)
        tool_loop.split_calls(gen)

    async def _finish(self, gen: Generation, error: str, timing: dict[str, float]) -> None:
        """The final save, then the news to the watchers and the group."""
        now = time.monotonic()
        if error:
            status = Message.Status.ERROR
        elif gen.stop_reason or gen.finish_reason in (None, "abort"):
            status = Message.Status.INTERRUPTED
        else:
            status = Message.Status.COMPLETE
        if status == Message.Status.ERROR:
            finish_reason = "error"
        else:
            finish_reason = gen.finish_reason or ("abort" if status == Message.Status.INTERRUPTED else "")
        first = timing.get("first_token")
        count = len(gen.token_ids)
        fields = {
            "content": gen.text,
            **gen.reasoning.message_fields(now),
            "status": status,
            "finish_reason": finish_reason,
            "error": error,
            "completion_tokens": count,
            "cached_tokens": gen.cached_tokens,
            "time_to_first_token_ms": (first - timing["started"]) * 1000 if first else None,
            "tokens_per_s": count / (now - first) if first and count > 1 and now > first else None,
            **tool_loop.answer_fields(gen),
        }
        written = None  # rows the final save matched; 0: fenced
        try:
            if gen.stop_reason != "deleted":
                ids = {"token_ids": gen.token_ids or None, "token_fingerprint": gen.fingerprint}
                written = await self.final_saves.save(gen.message_id, {**gen.start_fields, **ids, **fields})
        except Exception:
            log.exception("final save of message %s failed", gen.message_id)
        finally:
            self._drop(gen)
            self._cancel_grace(gen)
            self.relays.discard(gen)
        if written == 0:
            await self._fenced(gen)
            return
        if cluster.enabled():
            # The last piece, so that relayed deltas add up to the final text everywhere.
            await relay_piece(gen)
        message = {"id": gen.message_id, "prompt_tokens": gen.prompt_tokens, "context_dropped": gen.dropped}
        message.update(fields)
        prefix = _next_turn_prefix(gen, status)
        if prefix:  # before the watchers hear of it: their retention then reads nothing
            get_retention().answered(gen.conversation_id, gen.message_id, prefix, gen.cache_options)
        self._emit(
            gen.conversation_id,
            {"type": "finished", "conversation_id": gen.conversation_id, "message": message},
        )
        await broadcast(
            conversation_group(gen.conversation_id), "finished", message_id=gen.message_id, message=message
        )
        titles.answer_finished(gen.conversation_id, gen.message_id, status)

    async def _fenced(self, gen: Generation) -> None:
        """The answer is no longer this process's: whoever took it told every tab; this
        process's tabs may have shown text generated here since, so they get the row."""
        log.warning("answer %s is no longer this process's: its text here is dropped", gen.message_id)
        stored = await stored_message(gen.message_id)
        if stored is not None and stored["status"] != Message.Status.STREAMING:
            self._emit(
                gen.conversation_id,
                {"type": "finished", "conversation_id": gen.conversation_id, "message": stored},
            )


def _next_turn_prefix(gen: Generation, status: str) -> list[int]:
    """The ids the conversation's next prompt starts with, known without rendering it: this
    answer's prompt and its generated ids (the template renders a stored answer as the
    generation prompt, the ids and its end of turn). Empty where that does not hold or is
    not known: no exact prompt, a failed answer, reasoning (left out of later prompts),
    tools (rendered in the tools' format)."""
    if gen.prompt_ids is None or not gen.token_ids or status == Message.Status.ERROR:
        return []
    if gen.reasoning.text or gen.tools is not None or gen.tool_calls:
        return []
    return gen.prompt_ids + gen.token_ids


__all__ = ["RELAY_HZ", "STREAM_HEARTBEAT_SECONDS", "Generation", "GenerationManager"]
