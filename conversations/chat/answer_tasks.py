"""The tasks that run beside each live answer's generation (``conversations.chat.answers``):
the relay of its text to other processes' tabs (with the heartbeat of the watchdog contract)
and the partial saves."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.conf import settings

from conversations.chat.answer_rows import HEARTBEAT_SECONDS, update_message
from conversations.chat.groups import broadcast, conversation_group
from conversations.cluster import registry as cluster

# The manager and its Generation records (conversations.chat.answers, which imports this module).
GenerationManager = Any
Generation = Any

log = logging.getLogger(__name__)

# Tabs hear of a streaming answer at least this often (a delta, or else a heartbeat).
STREAM_HEARTBEAT_SECONDS = 5.0
# Group messages per second per answer at most (text is coalesced in between).
RELAY_HZ = 20.0


async def relay(manager: GenerationManager, gen: Generation) -> None:
    """New text and reasoning to the tabs of other processes, coalesced to at most
    RELAY_HZ group messages a second; a heartbeat to every tab when nothing was sent
    for a while."""
    last_signal = time.monotonic()
    try:
        while not gen.done.is_set():
            quiet = time.monotonic() - last_signal
            try:
                await asyncio.wait_for(gen.wake.wait(), timeout=max(0.0, STREAM_HEARTBEAT_SECONDS - quiet))
            except TimeoutError:
                pass
            gen.wake.clear()
            if unrelayed(gen):
                if cluster.enabled():
                    await relay_piece(gen)
                else:
                    gen.relayed, gen.relayed_reasoning = len(gen.text), len(gen.reasoning.text)
                last_signal = time.monotonic()
                await asyncio.sleep(1 / RELAY_HZ)
            elif time.monotonic() - last_signal >= STREAM_HEARTBEAT_SECONDS:
                last_signal = time.monotonic()
                event = {"type": "heartbeat", "conversation_id": gen.conversation_id}
                manager._emit(gen.conversation_id, {**event, "message_id": gen.message_id})
                if cluster.enabled():
                    await broadcast(
                        conversation_group(gen.conversation_id),
                        "heartbeat",
                        message_id=gen.message_id,
                        length=gen.relayed,
                        reasoning_length=gen.relayed_reasoning,
                    )
    except asyncio.CancelledError:
        pass


async def relay_piece(gen: Generation) -> None:
    """The text and reasoning not yet sent, as one group ``delta``: each part with the
    offset it starts at, so a tab elsewhere can tell a repeat from a gap."""
    if not unrelayed(gen):
        return
    offset, text = gen.relayed, gen.text[gen.relayed :]
    reasoning_offset, reasoning = gen.relayed_reasoning, gen.reasoning.text[gen.relayed_reasoning :]
    gen.relayed, gen.relayed_reasoning = offset + len(text), reasoning_offset + len(reasoning)
    await broadcast(
        conversation_group(gen.conversation_id),
        "delta",
        message_id=gen.message_id,
        offset=offset,
        text=text,
        reasoning_offset=reasoning_offset,
        reasoning=reasoning,
    )


async def saver(manager: GenerationManager, gen: Generation) -> None:
    """Writes the text so far every PARTIAL_SAVE_SECONDS until the answer is done."""
    saved_len = 0
    last_save = time.monotonic()
    while not gen.done.is_set():
        try:
            await asyncio.wait_for(gen.done.wait(), timeout=settings.PARTIAL_SAVE_SECONDS)
            return
        except TimeoutError:
            pass
        grown = len(gen.token_ids) != saved_len
        if not grown and time.monotonic() - last_save < HEARTBEAT_SECONDS:
            continue
        count = len(gen.token_ids)
        try:
            updated = await update_message(
                gen.message_id,
                content=gen.text,
                reasoning=gen.reasoning.text,
                token_ids=gen.token_ids[:count] or None,
                token_fingerprint=gen.fingerprint,
                completion_tokens=count,
            )
        except Exception:
            log.warning("partial save of message %s failed", gen.message_id, exc_info=True)
            continue
        if not updated:  # deleted, failed over or taken back: not this process's any more
            manager.stop(gen.message_id, "fenced")
            return
        saved_len, last_save = count, time.monotonic()


def unrelayed(gen: Generation) -> bool:
    return len(gen.text) > gen.relayed or len(gen.reasoning.text) > gen.relayed_reasoning
