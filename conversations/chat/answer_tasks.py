"""The tasks that run beside the live answers' generations (``conversations.chat.answers``),
one of each kind for all of them: the relay of their text to other processes' tabs (with
the heartbeat of the watchdog contract), and their partial saves."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from django.conf import settings

from conversations.chat.answer_rows import HEARTBEAT_SECONDS, save_partials
from conversations.chat.groups import broadcast, conversation_group
from conversations.chat.records import Answer, Emitter, LiveNode, StopReason
from conversations.cluster import registry as cluster

log = logging.getLogger(__name__)

# Tabs hear of a streaming answer at least this often (a delta, or else a heartbeat).
STREAM_HEARTBEAT_SECONDS = 5.0
# Group messages per second per answer at most (text is coalesced in between).
RELAY_HZ = 20.0


# How often the relay looks for quiet answers (the heartbeat's precision).
RELAY_TICK_SECONDS = 1.0


class AnswersTask:
    """One task that works for every live answer given it: it starts with the first, and
    ends when none is left (``_run`` loops while ``live``)."""

    name = ""

    def __init__(self) -> None:
        self.live: dict[int, LiveNode] = {}
        self.task: asyncio.Task | None = None

    def add(self, gen: LiveNode) -> None:
        self.live[gen.message_id] = gen
        self.track(gen)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def discard(self, gen: LiveNode) -> None:
        """``gen`` is done: nothing more for it."""
        if self.live.get(gen.message_id) is gen:
            del self.live[gen.message_id]
            self.untrack(gen.message_id)

    def track(self, gen: LiveNode) -> None:
        """This task's own record of a new answer."""

    def untrack(self, message_id: int) -> None:
        """Drop that record."""

    async def _run(self) -> None:
        raise NotImplementedError


class Relays(AnswersTask):
    """New text and reasoning of every live answer to the tabs of other processes
    (``relay_piece``), sent as soon as the first new piece comes and then at most RELAY_HZ
    times a second; and a heartbeat to every tab for an answer that sent nothing for
    STREAM_HEARTBEAT_SECONDS. With one process nothing is relayed, so a delta wakes nothing
    and the task only looks for quiet answers once a second."""

    name = "relays"

    def __init__(self, tabs: Emitter) -> None:
        super().__init__()
        self.tabs = tabs  # this process's tabs
        self.signalled: dict[int, float] = {}  # message id -> monotonic time of its last piece or heartbeat
        self.wake = asyncio.Event()
        self.relaying = False  # several processes (read as each answer starts)

    def track(self, gen: LiveNode) -> None:
        self.relaying = cluster.enabled()
        self.signalled[gen.message_id] = time.monotonic()

    def untrack(self, message_id: int) -> None:
        self.signalled.pop(message_id, None)

    def poke(self) -> None:
        """New text of some answer: relay it soon (nothing to do with one process)."""
        if self.relaying:
            self.wake.set()

    async def _run(self) -> None:
        while self.live:
            try:
                async with asyncio.timeout(RELAY_TICK_SECONDS):
                    await self.wake.wait()
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                if await self.tick():
                    await asyncio.sleep(1 / RELAY_HZ)
            except Exception:
                log.warning("relay failed", exc_info=True)

    async def tick(self) -> bool:
        """Relay what is new and send the heartbeats due; True if any went to the group. The
        group messages of all answers go out together (one round trip, not one each)."""
        now, relaying = time.monotonic(), cluster.enabled()
        sends = []
        for gen in list(self.live.values()):
            if gen.done.is_set():
                continue
            if unrelayed(gen):
                if relaying:
                    sends.append(relay_piece(gen))
                else:
                    gen.relayed, gen.relayed_reasoning = len(gen.text), len(gen.reasoning.text)
                self.signalled[gen.message_id] = now
            elif now - self.signalled.get(gen.message_id, now) >= STREAM_HEARTBEAT_SECONDS:
                self.signalled[gen.message_id] = now
                sends.append(self._heartbeat(gen, relaying))
        for failure in await asyncio.gather(*sends, return_exceptions=True):
            if isinstance(failure, Exception):
                log.warning("relay failed", exc_info=failure)
        return relaying and bool(sends)

    async def _heartbeat(self, gen: LiveNode, relaying: bool) -> None:
        event = {"type": "heartbeat", "conversation_id": gen.conversation_id, "message_id": gen.message_id}
        self.tabs.emit(gen.conversation_id, event)
        if relaying:
            await broadcast(
                conversation_group(gen.conversation_id),
                "heartbeat",
                message_id=gen.message_id,
                length=gen.relayed,
                reasoning_length=gen.relayed_reasoning,
            )


async def relay_piece(gen: LiveNode) -> None:
    """The text and reasoning not yet sent, as one group ``delta``: each part with the
    offset it starts at, so a tab elsewhere can tell a repeat from a gap."""
    if not unrelayed(gen):
        return
    offset, text = gen.relayed, gen.text[gen.relayed :]
    reasoning_offset, reasoning = gen.relayed_reasoning, gen.reasoning.text[gen.relayed_reasoning :]
    gen.relayed, gen.relayed_reasoning = offset + len(text), reasoning_offset + len(reasoning)
    await broadcast(
        conversation_group(gen.conversation_id),
        "delta",
        message_id=gen.message_id,
        offset=offset,
        text=text,
        reasoning_offset=reasoning_offset,
        reasoning=reasoning,
    )


class PartialSaves(AnswersTask):
    """The partial saves of every live answer: every PARTIAL_SAVE_SECONDS, the text so far
    of each answer that grew (or was not touched for HEARTBEAT_SECONDS), all in one
    database call and transaction, instead of a task and a write per answer (a finished
    answer's final save follows its discard). An answer whose row is no longer this
    process's is stopped (fenced)."""

    name = "partial-saves"

    def __init__(self, stop: Callable[[int, str], bool]) -> None:
        super().__init__()
        self.stop = stop  # the manager's: a fenced answer stops
        # message id -> (tokens saved, monotonic time of the last save)
        self.saved: dict[int, tuple[int, float]] = {}

    def track(self, gen: LiveNode) -> None:
        self.saved[gen.message_id] = (0, time.monotonic())

    def untrack(self, message_id: int) -> None:
        self.saved.pop(message_id, None)

    async def _run(self) -> None:
        while self.live:
            await asyncio.sleep(settings.PARTIAL_SAVE_SECONDS)
            try:
                await self.save_due()
            except Exception:
                log.warning("partial saves failed", exc_info=True)

    async def save_due(self) -> None:
        now = time.monotonic()
        due: list[tuple[Answer, int]] = []
        for message_id, gen in self.live.items():
            count, last = self.saved[message_id]
            if not gen.done.is_set() and (len(gen.token_ids) != count or now - last >= HEARTBEAT_SECONDS):
                due.append((gen, len(gen.token_ids)))
        if not due:
            return
        rows = [(gen.message_id, partial_fields(gen, count)) for gen, count in due]
        lost = await save_partials(rows)
        for gen, count in due:
            if gen.message_id in lost:
                # Deleted, failed over or taken back: not this process's any more (unless
                # it finished meanwhile, its final save already written).
                if not gen.done.is_set():
                    self.stop(gen.message_id, StopReason.FENCED)
            elif gen.message_id in self.saved:
                self.saved[gen.message_id] = (count, now)


def partial_fields(gen: Answer, count: int) -> dict[str, object]:
    return {
        "content": gen.text,
        "reasoning": gen.reasoning.text,
        "token_ids": gen.token_ids[:count] or None,
        "token_fingerprint": gen.fingerprint,
        "completion_tokens": count,
        **gen.start_fields,
    }


def unrelayed(gen: LiveNode) -> bool:
    return len(gen.text) > gen.relayed or len(gen.reasoning.text) > gen.relayed_reasoning
