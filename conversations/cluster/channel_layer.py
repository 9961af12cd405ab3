"""The Redis channel layer, without losing a message when a consumer goes away.

channels_redis reads every process-local channel (``specific.<client>!<id>``) of a layer
instance through one Redis sorted set: whichever ``receive()`` holds its receive lock pops
the next message, for any channel, and files it under that channel. When that receive is
cancelled mid-read (a websocket consumer disconnecting: Channels cancels its pending
receive), the message Redis has already handed it, possibly another consumer's, is lost;
and on Python 3.11 a cancellation can even be swallowed (``asyncio.wait_for`` inside
redis-py), leaving the cancelled receive reading on forever.

Here one task per layer instance, never cancelled by a consumer, does all the reading (the
*pump*) and files each message under its channel; ``receive()`` only waits for its own
channel's queue, which a cancellation cannot lose anything from. Delivery is otherwise
channels_redis's (the in-flight backup copy, capacity, expiry, groups).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)


class PumpedRedisChannelLayer(RedisChannelLayer):
    # Each blocking read waits at most this long: a cancellation swallowed inside redis-py
    # is noticed within it (an idle process reads Redis once a second).
    pump_read_seconds = 1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pump: asyncio.Task | None = None
        self._waiting: Counter[str] = Counter()

    async def receive(self, channel: str) -> dict:
        if "!" not in channel:
            return await super().receive(channel)  # a shared channel: read directly
        assert self.require_valid_channel_name(channel)
        real_channel = self.non_local_name(channel)
        assert real_channel.endswith(self.client_prefix + "!"), "Wrong client prefix"
        self._start_pump(real_channel)
        queue = self.receive_buffer[channel]
        self._waiting[channel] += 1
        try:
            return await queue.get()
        except asyncio.CancelledError:
            # The receiver went away: like channels_redis, drop what was filed for it.
            if self._waiting[channel] == 1 and self.receive_buffer.get(channel) is queue:
                del self.receive_buffer[channel]
            raise
        finally:
            self._waiting[channel] -= 1
            if not self._waiting[channel]:
                del self._waiting[channel]
                if self.receive_buffer.get(channel) is queue and queue.empty():
                    del self.receive_buffer[channel]

    def _start_pump(self, real_channel: str) -> None:
        loop = asyncio.get_running_loop()
        pump = self._pump
        if pump is not None and not pump.done():
            if pump.get_loop() is loop:
                return
            if pump.get_loop().is_running():
                raise RuntimeError("Two event loops are trying to receive() on one channel layer at once!")
            pump.cancel()  # its loop stopped (a test's): this loop reads from now on
        self._pump = loop.create_task(self._pump_messages(real_channel), name="channel-layer-pump")

    async def _pump_messages(self, real_channel: str) -> None:
        index = self.consistent_hash(real_channel)
        channel_key = self.prefix + real_channel
        task = asyncio.current_task()
        while True:
            # Stop when asked, even if redis-py swallowed the cancellation (asyncio.wait_for
            # on Python 3.11) or turned it into a connection error: else the loop's shutdown
            # would wait for this task forever.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            try:
                content = await self._brpop_with_clean(index, channel_key, timeout=self.pump_read_seconds)
            except asyncio.CancelledError:
                raise
            except Exception:
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from None
                log.warning("reading the channel layer failed", exc_info=True)
                await asyncio.sleep(1.0)
                continue
            if content is None:
                continue
            try:
                self._file(self.deserialize(content))
            except Exception:
                log.exception("an unreadable channel layer message was dropped")
            try:  # processed: its backup copy can go (else it is delivered again)
                await self._clean_receive_backup(index, channel_key)
            except Exception:
                log.warning("cleaning the channel layer backup failed", exc_info=True)

    def _file(self, message: dict) -> None:
        channels = message.pop("__asgi_channel__")
        for channel in channels if isinstance(channels, list) else [channels]:
            self.receive_buffer[channel].put_nowait(dict(message) if isinstance(channels, list) else message)
