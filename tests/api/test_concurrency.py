"""Sixteen streaming clients at once are batched by the engine, and each gets a whole stream."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.api.conftest import chat, parse_sse
from tests.live_site import METRICS_AUTH

pytestmark = pytest.mark.timeout(180)

CLIENTS = 16
TOKENS = 24


async def test_16_concurrent_streams_are_batched_and_each_is_complete(live_site, api_key, model_name):
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=CLIENTS + 4)
    peak_running = 0
    finished = asyncio.Event()

    async with httpx.AsyncClient(base_url=live_site.url, timeout=150, limits=limits) as http:

        async def watch() -> None:
            nonlocal peak_running
            while not finished.is_set():
                health = (await http.get("/healthz", headers=METRICS_AUTH)).json()
                stats = health["details"]["engine"]["stats"]
                peak_running = max(peak_running, stats["running"])
                await asyncio.sleep(0.02)

        async def one(i: int) -> list[dict]:
            body = {
                "model": model_name,
                "messages": chat(f"Client {i} says hello."),
                "max_tokens": TOKENS,
                "ignore_eos": True,
                "seed": i,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                assert response.status_code == 200
                return parse_sse((await response.aread()).decode())

        watcher = asyncio.create_task(watch())
        try:
            streams = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
        finally:
            finished.set()
            await watcher

    assert peak_running > 1, "the engine never ran two requests in one batch"
    ids = set()
    for events in streams:
        assert len({e["id"] for e in events}) == 1 and len({e["created"] for e in events}) == 1
        ids.add(events[0]["id"])
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        *content, usage = events
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == TOKENS
        assert all(e["usage"] is None for e in content)
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        assert all(e["choices"][0]["finish_reason"] is None for e in content[:-1])
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in content)
    assert len(ids) == CLIENTS
