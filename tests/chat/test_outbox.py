"""A socket's outbox: events in order, each run of one answer's deltas sent as one frame,
and frames handed to the server past Channels' session wrapper; events handled without
Channels' database hop."""

from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import StopConsumer
from channels.sessions import InstanceSessionWrapper

from conversations.chat.socket_base import JsonSocketConsumer, Outbox


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
