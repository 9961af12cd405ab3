"""The chat consumer's base: Channels' JSON websocket consumer without a database hop per event.

Channels' ``AsyncConsumer.dispatch`` closes stale database connections before every
handler (one call to the database thread for each message received and each group event),
for handlers that use the ORM without ``database_sync_to_async``. The chat's handlers reach
the database only through ``database_sync_to_async``, which does that itself around each
call, so the hop per event does nothing here but cost both threads.
"""

from __future__ import annotations

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer


class JsonSocketConsumer(AsyncJsonWebsocketConsumer):
    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
