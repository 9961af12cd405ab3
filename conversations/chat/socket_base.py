"""The chat consumer's base: Channels' JSON websocket consumer without a database hop per
event.

Channels' ``AsyncConsumer.dispatch`` closes stale database connections before every
handler (one call to the database thread for each message received and each group event),
for handlers that use the ORM without ``database_sync_to_async``. The chat's handlers reach
the database only through ``database_sync_to_async``, which does that itself around each
call, so the hop per event does nothing here but cost both threads.
"""

from __future__ import annotations

import asyncio
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
from django.conf import settings

from inference.engine.mailbox import Mailbox

log = logging.getLogger(__name__)

# A send that failed (a frame over the size limit, the server refusing it): the socket is
# closed with this code after an ``error`` event, so the tab says so and reconnects.
CLOSE_SEND_FAILED = 4500


class FrameTooLarge(ValueError):
    """An event whose frame would exceed ``WEBSOCKET_MAX_MESSAGE_BYTES``."""


def frame_limit() -> int:
    """The largest websocket message the server sends: Daphne's ``websocket_max_message_size``
    (1 MiB unless started with another), which Autobahn enforces by raising on the send."""
    return int(getattr(settings, "WEBSOCKET_MAX_MESSAGE_BYTES", 1024 * 1024))


def frame_text(content: dict) -> str:
    """``content`` as a frame's text; raises :class:`FrameTooLarge` past the limit (checked on
    the UTF-8 size only when the text could be near it)."""
    text = json_text(content)
    limit = frame_limit()
    if len(text) * 4 > limit and len(text.encode()) > limit:
        raise FrameTooLarge(f"a {content.get('type')!r} event of {len(text.encode())} bytes (limit {limit})")
    return text


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
        await self.send_frame({"type": "websocket.send", "text": frame_text(content)})
        if close:
            await self.close()

    # Set by subclasses that push through an outbox (``deliver``).
    write_now: Callable[[dict], None] | None = None

    def deliver(self, event: dict) -> None:
        """Queue ``event`` without awaiting. With nothing queued before it, it is written at
        once (one task wake-up fewer per streamed delta); otherwise it waits its turn in the
        outbox. A send that fails closes the socket with an error (``send_failed``)."""
        write = self.write_now
        if write is not None and self.outbox.empty():
            try:
                write({"type": "websocket.send", "text": frame_text(event)})
            except Exception as exc:
                self.send_failed(exc)
        else:
            self.outbox.put(event)

    def send_failed(self, exc: BaseException) -> None:
        """A frame could not be sent: never silence. The tab gets a small ``error`` event if
        the socket still takes one, then the socket closes with ``CLOSE_SEND_FAILED``."""
        log.warning(
            "websocket send failed, closing the socket: %s", exc, exc_info=not isinstance(exc, FrameTooLarge)
        )
        self.write_now = None
        if getattr(self, "closing", False):
            return
        self.closing = True
        detail = (
            "A message was too large to send; the connection is closed."
            if isinstance(exc, FrameTooLarge)
            else "The server could not send to this tab; the connection is closed."
        )
        error = {"type": "error", "code": "send_failed", "detail": detail}

        async def close() -> None:
            try:
                await self.send_frame({"type": "websocket.send", "text": json_text(error)})
            except Exception:
                log.debug("the error could not be sent either", exc_info=True)
            try:
                await self.close(code=CLOSE_SEND_FAILED)
            except Exception:
                log.debug("close failed; the socket is gone", exc_info=True)

        self.closer = asyncio.ensure_future(close())

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
                except Exception as exc:
                    self.send_failed(exc)
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
