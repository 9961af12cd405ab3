"""Fixtures for the OpenAI-compatible API: keys, the official clients, engine stats."""

from __future__ import annotations

import json
import time

import openai
import pytest

from conversations.models import ApiKey, ApiRequest
from tests.live_site import health_details


def engine_stats(site) -> dict:
    return health_details(site.url)["engine"]["stats"]


def wait_until_idle(site, timeout: float = 20.0) -> dict:
    """Stats once nothing runs or waits (the engine thread updates them after each step)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(site)
        if stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine did not go idle: {stats}")
        time.sleep(0.02)


def wait_for_rows(user, count: int, timeout: float = 10.0, **filters) -> list[ApiRequest]:
    """Usage rows are written in the background after the response: poll for them."""
    deadline = time.monotonic() + timeout
    while True:
        rows = list(ApiRequest.objects.filter(owner=user, **filters).order_by("created_at", "id"))
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


@pytest.fixture
def api_user(transactional_db, make_user):
    return make_user("api-user")


@pytest.fixture
def api_key(api_user, live_site) -> str:
    _key, raw = ApiKey.objects.create_key(api_user, name="tests")
    yield raw
    # Let this test's generations end and their usage rows land before the database is flushed.
    wait_until_idle(live_site)
    time.sleep(0.2)


@pytest.fixture(scope="session")
def model_name(live_site) -> str:
    return health_details(live_site.url)["engine"]["model"]


@pytest.fixture
def openai_client(live_site, api_key) -> openai.OpenAI:
    with openai.OpenAI(base_url=f"{live_site.url}/v1", api_key=api_key, max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
async def async_openai_client(live_site, api_key) -> openai.AsyncOpenAI:
    c = openai.AsyncOpenAI(base_url=f"{live_site.url}/v1", api_key=api_key, max_retries=0, timeout=60)
    yield c
    await c.close()


def chat(content: str = "Hello!") -> list[dict]:
    return [{"role": "user", "content": content}]


def parse_sse(text: str) -> list[dict]:
    """Data-only server-sent events, strictly: ``data: <json>`` blocks, ending with [DONE]."""
    assert text.endswith("\n\n"), text[-200:]
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    assert blocks[-1] == "data: [DONE]"
    assert blocks.count("data: [DONE]") == 1
    return [json.loads(b[len("data: ") :]) for b in blocks[:-1]]


def wait_for_stats(site, predicate, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(site)
        if predicate(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine stats never matched: {stats}")
        time.sleep(0.02)
