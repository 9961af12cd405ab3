"""A socket's outbox: events in order, each run of one answer's deltas sent as one frame,
and frames handed to the server past Channels' session wrapper (to Daphne as a plain call,
at once when nothing waits before them); events handled without Channels' database hop."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest
from channels.exceptions import StopConsumer
from channels.sessions import InstanceSessionWrapper

from conversations.chat.consumers import ChatConsumer
from conversations.chat.socket_base import JsonSocketConsumer, Outbox, daphne_frame_writer


def delta(message_id: int, text: str) -> dict:
    return {"type": "delta", "message_id": message_id, "text": text}


async def test_take_waits_for_events_and_merges_runs_of_one_answers_deltas_in_order():
    outbox = Outbox()
    taker = asyncio.ensure_future(outbox.take())
    await asyncio.sleep(0)
    assert not taker.done()  # nothing yet: it waits
    for event in [
        delta(1, "Hel"),
        delta(1, "lo"),
        delta(2, "Other"),
        {"type": "finished", "message_id": 1},
        delta(1, "!"),
        delta(1, "?"),
    ]:
        outbox.put(event)
    assert await taker == [
        delta(1, "Hello"),
        delta(2, "Other"),
        {"type": "finished", "message_id": 1},
        delta(1, "!?"),
    ]
    outbox.put(delta(3, "x"))
    assert await outbox.take() == [delta(3, "x")]


async def test_frames_skip_the_session_wrapper_and_reach_the_servers_send():
    frames: list[dict] = []

    async def server_send(message: dict) -> None:
        frames.append(message)

    wrapper = InstanceSessionWrapper.__new__(InstanceSessionWrapper)
    wrapper.real_send = server_send
    consumer = JsonSocketConsumer()
    consumer.base_send = wrapper.send
    await consumer.send_json({"type": "delta", "message_id": 1, "text": "é"})
    assert frames == [{"type": "websocket.send", "text": '{"type":"delta","message_id":1,"text":"é"}'}]


async def test_events_and_disconnects_are_handled_without_a_call_to_the_database_thread(monkeypatch):
    hops: list[str] = []

    async def close_old_connections() -> None:
        hops.append("hop")

    monkeypatch.setattr("channels.consumer.aclose_old_connections", close_old_connections)
    monkeypatch.setattr("channels.generic.websocket.aclose_old_connections", close_old_connections)
    handled: list[dict] = []

    class Consumer(JsonSocketConsumer):
        groups: list[str] = []

        async def chat_event(self, event: dict) -> None:
            handled.append(event)

        async def disconnect(self, code) -> None:
            handled.append({"closed": code})

    consumer = Consumer()
    await consumer.dispatch({"type": "chat.event", "n": 1})
    with pytest.raises(StopConsumer):
        await consumer.dispatch({"type": "websocket.disconnect", "code": 1000})
    assert handled == [{"type": "chat.event", "n": 1}, {"closed": 1000}]
    assert hops == []
    with pytest.raises(ValueError, match="No handler"):
        await consumer.dispatch({"type": "nothing.here"})


class RecordingProtocol:
    def __init__(self) -> None:
        self.replies: list[dict] = []

    def handle_reply(self, message: dict) -> None:
        self.replies.append(message)


def daphne_send(connections: dict) -> tuple:
    from daphne.server import Server

    server = Server.__new__(Server)  # its send path only: no reactor, no listening
    server.connections = connections
    protocol = RecordingProtocol()
    return functools.partial(server.handle_reply, protocol), protocol


async def test_daphnes_send_as_a_plain_call_does_what_its_coroutine_does():
    connections: dict = {}
    send, protocol = daphne_send(connections)
    write = daphne_frame_writer(send)
    frame = {"type": "websocket.send", "text": "hi"}
    write(frame)  # not connected (yet, or any more): dropped, as Daphne drops it
    await send(frame)
    assert protocol.replies == []
    connections[protocol] = {}
    write(frame)
    await send(frame)
    assert protocol.replies == [frame, frame]
    connections[protocol]["disconnected"] = True
    write(frame)
    await send(frame)
    assert protocol.replies == [frame, frame]


async def test_any_other_send_has_no_plain_call():
    async def send(message: dict) -> None:
        pass

    assert daphne_frame_writer(send) is None
    assert daphne_frame_writer(functools.partial(send)) is None


async def test_a_tab_writes_an_event_at_once_unless_events_wait_before_it():
    written: list[dict] = []
    consumer = ChatConsumer()
    consumer.outbox = Outbox()
    consumer.write_now = None  # not accepted yet: queued
    consumer.push(delta(1, "a"))
    consumer.write_now = written.append
    consumer.push(delta(1, "b"))  # behind "a": queued too, in order
    assert written == [] and await consumer.outbox.take() == [delta(1, "ab")]
    consumer.push(delta(1, "c"))  # nothing waits: written now
    assert [json.loads(f["text"]) for f in written] == [delta(1, "c")]
    assert consumer.outbox.empty()
