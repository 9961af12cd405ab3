"""What one tab is shown of its open conversation: the one place that decides the text of
each message it sees.

A message's text is, in this order of authority:

1. its live text here, where this process generates it (``GenerationManager.live_text``):
   the row lags it by up to ``PARTIAL_SAVE_SECONDS``;
2. for an answer another process generates, the saved text, then the owner's relayed
   pieces from that length on (``conversations.cluster.relay``: each piece with its
   character offsets; a gap is filled by asking the owner for a snapshot);
3. otherwise its row.

:meth:`TabView.send_thread` builds the thread so: rows read once, live text laid over them,
and the relayed answers' lengths taken from the same read, so that the deltas queued before
the thread are in it and those after follow it. An answer of this process that finished
while the thread was read was read half-saved and is no longer live: the read is made
again (at most twice more) to get its final row.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

from conversations.chat.lifecycle import settle_orphans
from conversations.chat.manager import get_manager
from conversations.chat.processes import live_processes, liveness_of
from conversations.chat.queries import CreatedAnswer, load_earlier, load_thread
from conversations.chat.thread_dicts import every_message
from conversations.chat.tree import Tree
from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID
from conversations.cluster.relay import Shown, behind, take
from conversations.models import Conversation, Message

log = logging.getLogger(__name__)

SNAPSHOT_RETRY_SECONDS = 1.0
READS = 3  # of a thread, at most (see the module's docstring)


class Tab(Protocol):
    """The socket a view pushes to."""

    channel_name: str

    def push(self, event: dict) -> None:
        """Queue an event for the browser, without blocking."""


@dataclass
class Created:
    """An answer just created, with what its creation read and chose."""

    row: CreatedAnswer
    owner: str  # the process that generates it
    processes: dict[str, cluster.ProcessInfo]
    liveness: cluster.Liveness


class TabView:
    def __init__(self, tab: Tab) -> None:
        # A weak reference: the tab holds its view, and a cycle between them would keep a
        # closed socket's objects until a full garbage collection.
        self.tab: Tab = weakref.proxy(tab)
        self.conversation: Conversation | None = None
        # Answers generated in other processes: message id -> what this tab shows of each.
        self.relayed: dict[int, Shown] = {}
        self.snapshot_asked: dict[int, float] = {}

    def follow(self, message_id: int) -> None:
        """A new answer of another process: this tab shows it from its start."""
        self.relayed[message_id] = Shown()

    def forget_relayed(self) -> None:
        self.relayed.clear()

    async def send_thread(self, created: Created | None = None, fresh: bool = False) -> dict | None:
        """Push the visible thread, also returned. ``created``: what an answer's creation just
        read, so as not to read it again (its answer is streaming and not started yet).
        ``fresh``: ``conversation`` was just read."""
        if self.conversation is None:
            return None
        manager = get_manager()
        live = {g.message_id for g in manager.live_in(self.conversation.pk)}
        if created is not None:
            loaded = (created.row.tree, created.row.thread)
            processes, liveness, new = created.processes, created.liveness, created.row.answer.pk
        else:
            loaded, processes, liveness, new = None, await live_processes(), None, None
        liveness = liveness or await liveness_of(processes)
        for attempt in range(READS):
            try:
                tree, data = loaded or await self._read(live, liveness, refresh=attempt > 0 or not fresh)
            except Conversation.DoesNotExist:
                self.tab.push({"type": "deleted", "conversation_id": self.conversation.pk})
                return None
            loaded = None
            if not self._finished_while_read(tree, data, new):
                break
        await self._lay_live_text(tree, data, processes)
        self.tab.push({"type": "thread", **data})
        return data

    async def send_earlier(self, before_id) -> None:
        """Push the page of the thread before ``before_id`` (older messages, on scroll). They
        are finished messages: no live text to lay over them."""
        if self.conversation is None:
            return
        page = await load_earlier(self.conversation, before_id)
        self.tab.push({"type": "earlier", "conversation_id": self.conversation.pk, **page})

    async def _read(self, live: set[int], liveness: cluster.Liveness, refresh: bool) -> tuple[Tree, dict]:
        """The tree and the thread; the orphans it shows as interrupted are then stored so by
        the lifecycle (a read writes nothing)."""
        read = await load_thread(self.conversation, live, liveness, refresh)
        if read.orphans:
            await settle_orphans(read.orphans)
        return read.tree, read.thread

    @staticmethod
    def _finished_while_read(tree: Tree, data: dict, new: int | None) -> bool:
        """An answer of this process read ``streaming`` that is no longer live here."""
        manager = get_manager()
        return any(
            m["status"] == Message.Status.STREAMING
            and tree.by_id[m["id"]].owner_process == PROCESS_ID
            and manager.live_text(m["id"]) is None
            and m["id"] != new
            for m in every_message(data["messages"])
        )

    async def _lay_live_text(self, tree: Tree, data: dict, processes: dict[str, cluster.ProcessInfo]) -> None:
        manager = get_manager()
        self.relayed.clear()
        for message in every_message(data["messages"]):
            text = manager.live_text(message["id"])
            if text is not None:
                message["content"] = text
                message["reasoning"] = manager.live_reasoning(message["id"]) or ""
                message["status"] = Message.Status.STREAMING
            elif message["status"] == Message.Status.STREAMING:
                # Generated elsewhere: the saved text now, the owner's deltas from there on.
                self.relayed[message["id"]] = Shown(len(message["content"]), len(message["reasoning"] or ""))
                owner = tree.by_id[message["id"]].owner_process
                await self._ask_snapshot(message["id"], owner, processes)

    # Answers of other processes ----------------------------------------------------------
    async def group_event(self, kind: str | None, event: dict) -> None:
        """A group event about an answer; this process's tabs get its own answers' events
        from the manager directly."""
        if event.get("process") == PROCESS_ID:
            return
        cid = self.conversation.pk
        if kind in ("delta", "snapshot"):
            await self._relay_text(event)
        elif kind == "heartbeat":
            message_id = event.get("message_id")
            self.tab.push({"type": "heartbeat", "conversation_id": cid, "message_id": message_id})
            if behind(self.relayed.get(message_id, Shown()), event):
                await self._ask_snapshot(message_id, event.get("process"))
        elif kind == "finished" and event.get("message"):
            message = event["message"]
            self.relayed.pop(message.get("id"), None)
            self.tab.push({"type": "finished", "conversation_id": cid, "message": message})
        elif kind in ("started", "progress", "finished"):
            # Generated in another process: show the saved text (and follow its deltas).
            await self.send_thread()
            if kind == "started":  # as a tab of the owner's process hears it
                fields = {k: event.get(k, 0) for k in ("message_id", "context_dropped", "prompt_tokens")}
                self.tab.push({"type": "started", "conversation_id": cid, **fields})

    async def _relay_text(self, event: dict) -> None:
        """A piece of an answer generated elsewhere (text and reasoning): show what this
        tab has not seen yet, or ask for a snapshot if it missed some."""
        message_id = event.get("message_id")
        if message_id not in self.relayed:
            if event.get("event") == "snapshot":
                return
            await self.send_thread()  # a new answer this tab does not know yet
            if message_id not in self.relayed:
                return
        fresh = take(self.relayed[message_id], event)
        if fresh is None:
            await self._ask_snapshot(message_id, event.get("process"))
        elif fresh["text"] or fresh.get("reasoning"):
            cid = self.conversation.pk
            self.tab.push({"type": "delta", "conversation_id": cid, "message_id": message_id, **fresh})

    async def _ask_snapshot(self, message_id: int, owner: str | None, processes: dict | None = None) -> None:
        """Ask the owner for the text so far (this tab missed some of it)."""
        now = time.monotonic()
        if (
            not owner
            or owner == PROCESS_ID
            or now - self.snapshot_asked.get(message_id, 0) < SNAPSHOT_RETRY_SECONDS
        ):
            return
        self.snapshot_asked[message_id] = now
        processes = processes if processes is not None else await live_processes()
        if owner in processes:
            await cluster.send_to_process(
                processes[owner],
                {"type": "chat.snapshot", "message_id": message_id, "reply": self.tab.channel_name},
            )
