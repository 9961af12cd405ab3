"""The in-memory channel layer of a site served by one process (no ``REDIS_URL``).

Channels' ``InMemoryChannelLayer`` walks every channel's queue and every group's members
to expire old ones on each ``receive()``, and builds a queue object on every ``send()``
and ``receive()`` even when the channel has one: with many tabs open (each consumer
receives after each message, each tab is in a user and a conversation group) that is work
in proportion to the tabs, per message; and a group send starts a task per member. Here
the expiry walk runs at most once per ``CLEAN_SECONDS``, so messages and memberships
expire that much later at most; a queue is made only for a channel that has none; a group
send puts the message on each member's queue in turn. Delivery is otherwise Channels'.
"""

from __future__ import annotations

import asyncio
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

CLEAN_SECONDS = 1.0


class LeanInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cleaned = 0.0

    def _queue(self, channel: str) -> asyncio.Queue:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        return queue

    async def send(self, channel: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        try:
            self._queue(channel).put_nowait((time.time() + self.expiry, deepcopy(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    def _clean_now_and_then(self) -> None:
        now = time.monotonic()
        if now - self._cleaned >= CLEAN_SECONDS:
            self._cleaned = now
            self._clean_expired()

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_now_and_then()
        for channel in list(self.groups.get(group, ())):
            try:
                await self.send(channel, message)
            except ChannelFull:
                pass

    async def receive(self, channel: str) -> dict:
        self.require_valid_channel_name(channel)
        self._clean_now_and_then()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        finally:
            if queue.empty() and self.channels.get(channel) is queue:
                self.channels.pop(channel, None)
        return message
