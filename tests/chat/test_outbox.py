"""A socket's outbox: events in order, each run of one answer's deltas sent as one frame,
and frames handed to the server past Channels' session wrapper."""

from __future__ import annotations

import asyncio

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
