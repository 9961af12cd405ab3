"""The one relay task of a generation manager: with one process a delta wakes nothing,
and an answer quiet for a while gets a heartbeat to its tabs, one per quiet spell."""

from __future__ import annotations

import asyncio
import time

import pytest

from conversations.chat.answer_tasks import STREAM_HEARTBEAT_SECONDS, Relays
from conversations.chat.records import Answer


class Manager:
    def __init__(self) -> None:
        self.emitted: list[tuple[int, dict]] = []

    def emit(self, conversation_id: int, event: dict) -> None:
        self.emitted.append((conversation_id, event))


def generation(message_id: int) -> Answer:
    return Answer(
        message_id=message_id, conversation_id=100 + message_id, owner_id=1, request_id=f"r{message_id}"
    )


@pytest.fixture
def one_process(monkeypatch):
    monkeypatch.setattr("conversations.cluster.registry.enabled", lambda: False)


@pytest.mark.usefixtures("one_process")
async def test_a_quiet_answer_gets_one_heartbeat_per_quiet_spell_and_a_growing_one_none():
    manager = Manager()
    relays = Relays(manager)
    quiet, growing, finished = generation(1), generation(2), generation(3)
    for gen in (quiet, growing, finished):
        relays.add(gen)
    long_ago = time.monotonic() - STREAM_HEARTBEAT_SECONDS - 1
    relays.signalled.update({1: long_ago, 2: long_ago, 3: long_ago})
    growing.text = "new text"
    finished.done.set()

    relays.poke()  # one process: nothing to relay, nothing woken
    assert not relays.wake.is_set()
    assert await relays.tick() is False  # nothing went to other processes
    assert manager.emitted == [
        (101, {"type": "heartbeat", "conversation_id": 101, "message_id": 1}),
    ]
    assert growing.relayed == len("new text")  # counted as sent: its tabs had the delta
    await relays.tick()  # the same quiet spell: no second heartbeat
    assert len(manager.emitted) == 1

    relays.discard(quiet)
    relays.discard(growing)
    relays.discard(finished)
    await asyncio.sleep(0)
    assert not relays.live
    relays.task.cancel()
