"""The chat consumer's base: Channels' JSON websocket consumer without a database hop per
event.

Channels' ``AsyncConsumer.dispatch`` closes stale database connections before every
handler (one call to the database thread for each message received and each group event),
for handlers that use the ORM without ``database_sync_to_async``. The chat's handlers reach
the database only through ``database_sync_to_async``, which does that itself around each
call, so the hop per event does nothing here but cost both threads.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from functools import cached_property

import orjson
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.sessions import InstanceSessionWrapper
from daphne.server import Server as DaphneServer

from inference.engine.mailbox import Mailbox

log = logging.getLogger(__name__)


def json_text(content: dict) -> str:
    """orjson, several times faster than ``json`` on every streamed delta; its UTF-8
    output suits a text frame. Anything orjson refuses goes through ``json``."""
    try:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(content)


class JsonSocketConsumer(AsyncJsonWebsocketConsumer):
    @classmethod
    async def encode_json(cls, content: dict) -> str:
        return json_text(content)

    async def send_json(self, content: dict, close: bool = False) -> None:
        """Channels' ``send_json`` without its three coroutine layers (an awaited encoder,
        the text send, the base send) on every streamed delta: one frame to the server."""
        await self.send_frame({"type": "websocket.send", "text": json_text(content)})
        if close:
            await self.close()

    @cached_property
    def send_frame(self) -> Callable[[dict], Awaitable[None]]:
        """The server's send. Channels' session wrapper around it acts on an HTTP
        response's start alone: for a websocket frame it only reads the session (twice,
        through its lazy proxy), so frames skip it."""
        wrapper = getattr(self.base_send, "__self__", None)
        return wrapper.real_send if isinstance(wrapper, InstanceSessionWrapper) else self.base_send

    @cached_property
    def write_frame(self) -> Callable[[dict], None] | None:
        """The server's send as a plain call, where the server is Daphne (else None)."""
        return daphne_frame_writer(self.send_frame)

    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    # The groups this socket joined, and its outbox's sender (for subclasses that set
    # ``groups_joined`` and ``outbox``).
    groups_joined: list[str]
    outbox: Outbox

    async def _join(self, group: str) -> None:
        if group not in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)

    async def _leave(self, group: str) -> None:
        if group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
            self.groups_joined.remove(group)

    async def _leave_all(self) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    async def _send_loop(self) -> None:
        """Sends queued events in order (runs of deltas to a slow socket merged: ``Outbox``)."""
        while True:
            for event in await self.outbox.take():
                try:
                    await self.send_json(event)
                except Exception:
                    log.debug("send failed; the socket is closing", exc_info=True)
                    return

    async def websocket_disconnect(self, message: dict) -> None:
        """As Channels', without its database hop after ``disconnect`` (see above)."""
        for group in self.groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.disconnect(message["code"])
        raise StopConsumer()


def daphne_frame_writer(send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], None] | None:
    """For Daphne's send, ``partial(Server.handle_reply, protocol)``: a function doing what
    that coroutine does with a websocket message, without a coroutine to run (it never
    suspends: it drops the message if the connection is gone, else hands it to the protocol,
    which writes the frame to its transport). None for any other send (a test's communicator)."""
    if not isinstance(send, functools.partial) or len(send.args) != 1 or send.keywords:
        return None
    server = getattr(send.func, "__self__", None)
    if not isinstance(server, DaphneServer) or send.func.__func__ is not DaphneServer.handle_reply:
        return None
    protocol, connections = send.args[0], server.connections

    def write(message: dict) -> None:
        state = connections.get(protocol)
        if state is not None and not state.get("disconnected"):
            protocol.handle_reply(message)

    return write


class Outbox(Mailbox):
    """One socket's events, in order. ``take`` waits for some and returns all there are,
    with each run of one answer's deltas merged into one: a socket that falls behind gets
    fewer, larger frames. Used on the event loop's thread only."""

    put = Mailbox.put_nowait

    async def take(self) -> list[dict]:
        return merge_delta_runs(await self.get_all())


def merge_delta_runs(events: list[dict]) -> list[dict]:
    """``events`` with each run of consecutive deltas of one answer as one delta."""
    out: list[dict] = []
    for event in events:
        last = out[-1] if out else None
        if (
            last is not None
            and event.get("type") == "delta" == last.get("type")
            and event["message_id"] == last["message_id"]
        ):
            out[-1] = merge_deltas(last, event)
        else:
            out.append(event)
    return out


def merge_deltas(first: dict, second: dict) -> dict:
    """One ``delta`` event saying what two consecutive ones of the same answer said."""
    merged = {**first, "text": first["text"] + second["text"]}
    reasoning = first.get("reasoning", "") + second.get("reasoning", "")
    if reasoning:
        merged["reasoning"] = reasoning
    return merged
