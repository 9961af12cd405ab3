"""Readiness probes for /healthz: each returns (ready, detail)."""

from __future__ import annotations

import asyncio
import uuid

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection


def _database_ping() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


async def database_ready() -> tuple[bool, str]:
    try:
        await sync_to_async(_database_ping)()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, connection.vendor


# A layer that cannot answer within this is "not ready", not a hung health check.
CHANNEL_LAYER_TIMEOUT_S = 2.0


async def channel_layer_ready(timeout: float | None = None) -> tuple[bool, str]:
    timeout = CHANNEL_LAYER_TIMEOUT_S if timeout is None else timeout
    layer = get_channel_layer()
    if layer is None:
        return False, "no channel layer configured"

    async def round_trip() -> dict:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "health.ping", "token": token})
        return await layer.receive(channel)

    token = uuid.uuid4().hex
    try:
        message = await asyncio.wait_for(round_trip(), timeout)
    except TimeoutError:
        return False, f"no answer within {timeout:g} s"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if message.get("token") != token:
        return False, "round trip returned a different message"
    return True, type(layer).__name__
