"""The one-process channel layer (conversations.cluster.memory_layer): Channels' delivery,
with the expiry walk now and then instead of on every receive."""

from __future__ import annotations

import asyncio

import pytest

from conversations.cluster import memory_layer
from conversations.cluster.memory_layer import LeanInMemoryChannelLayer


async def test_messages_reach_their_channel_in_order_and_groups_reach_every_member():
    layer = LeanInMemoryChannelLayer()
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.send(first, {"type": "a", "n": 1})
    await layer.send(first, {"type": "a", "n": 2})
    assert [(await layer.receive(first))["n"] for _ in range(2)] == [1, 2]
    await layer.group_add("g", first)
    await layer.group_add("g", second)
    message = {"type": "b", "body": {"x": [1]}}
    await layer.group_send("g", message)
    got = [await layer.receive(first), await layer.receive(second)]
    assert got == [message, message]
    got[0]["body"]["x"].append(2)  # each member has its own copy
    assert got[1]["body"]["x"] == [1] and message["body"]["x"] == [1]
    await layer.group_discard("g", first)
    await layer.group_send("g", {"type": "c"})
    assert (await layer.receive(second))["type"] == "c"
    assert first not in layer.channels


async def test_expired_messages_are_dropped_at_the_next_walk(monkeypatch):
    layer = LeanInMemoryChannelLayer(expiry=0)
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    await layer.send(channel, {"type": "old"})
    await asyncio.sleep(0.01)
    monkeypatch.setattr(memory_layer, "CLEAN_SECONDS", 0.0)
    waiting = asyncio.create_task(layer.receive(channel))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # the expired message was dropped, with the channel's membership
    assert channel not in layer.groups.get("g", {})
    waiting.cancel()


async def test_a_full_channel_refuses_a_send_but_not_a_group_send():
    from channels.exceptions import ChannelFull

    layer = LeanInMemoryChannelLayer(capacity=1)
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    await layer.send(channel, {"type": "one"})
    with pytest.raises(ChannelFull):
        await layer.send(channel, {"type": "two"})
    await layer.group_send("g", {"type": "three"})  # dropped for that member, as Channels does
    assert (await layer.receive(channel))["type"] == "one"
