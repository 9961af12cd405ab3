"""The chat consumer's side of answers generated in other processes: the owner's relayed
pieces of text and reasoning (shown from where this tab is, or a snapshot asked for when
it missed some), heartbeats, and the coarse events (``conversations.cluster.relay``)."""

from __future__ import annotations

import time

from conversations.chat.socket_base import live_processes
from conversations.cluster import registry as cluster
from conversations.cluster.registry import PROCESS_ID
from conversations.cluster.relay import Shown, behind, take

SNAPSHOT_RETRY_SECONDS = 1.0


class RemoteAnswers:
    """Mixed into the chat consumer, which provides ``conversation``, ``relayed`` (message id
    -> ``Shown``), ``snapshot_asked``, ``channel_name``, ``push`` and ``_send_thread``."""

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
                {"type": "chat.snapshot", "message_id": message_id, "reply": self.channel_name},
            )

    async def _relay_text(self, event: dict) -> None:
        """A piece of an answer generated elsewhere (text and reasoning): show what this
        tab has not seen yet, or ask for a snapshot if it missed some."""
        message_id = event.get("message_id")
        if message_id not in self.relayed:
            if event.get("event") == "snapshot":
                return
            await self._send_thread()  # a new answer this tab does not know yet
            if message_id not in self.relayed:
                return
        fresh = take(self.relayed[message_id], event)
        if fresh is None:
            await self._ask_snapshot(message_id, event.get("process"))
        elif fresh["text"] or fresh.get("reasoning"):
            self.push(
                {"type": "delta", "conversation_id": self.conversation.pk, "message_id": message_id, **fresh}
            )

    async def _remote_event(self, kind: str | None, event: dict) -> None:
        """A group event about an answer another process generates."""
        if kind in ("delta", "snapshot"):
            await self._relay_text(event)
        elif kind == "heartbeat":
            message_id = event.get("message_id")
            self.push(
                {"type": "heartbeat", "conversation_id": self.conversation.pk, "message_id": message_id}
            )
            if behind(self.relayed.get(message_id, Shown()), event):
                await self._ask_snapshot(message_id, event.get("process"))
        elif kind == "finished" and event.get("message"):
            message = event["message"]
            self.relayed.pop(message.get("id"), None)
            self.push({"type": "finished", "conversation_id": self.conversation.pk, "message": message})
        elif kind in ("started", "progress", "finished"):
            # Generated in another process: show the saved text (and follow its deltas).
            await self._send_thread()
            if kind == "started":  # as a tab of the owner's process hears it
                fields = {k: event.get(k, 0) for k in ("message_id", "context_dropped", "prompt_tokens")}
                self.push({"type": "started", "conversation_id": self.conversation.pk, **fields})
