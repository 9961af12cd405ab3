"""Token quotas enforced by the engine across two real Daphne processes on one PostgreSQL
and one Redis: a completion quota of 500 tokens stops chat answers and API streams (20 in
flight at once, both processes) at the budget, within one engine step's tokens; then the
chat refuses with what ran out and when it resets, and /v1 answers 429 with Retry-After and
``insufficient_quota``. Skipped without DATABASE_URL and REDIS_URL."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from asgiref.sync import sync_to_async

from conversations.models import ApiKey, AuditEvent, TokenQuota
from tests.chat.test_cluster import (  # noqa: F401  (fixtures)
    Tab,
    cluster_model_dir,
    conversation_of,
    cookie,
    running_cluster,
    user,
)
from tests.support.quota_counters import forget_counters

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs DATABASE_URL and REDIS_URL: several processes share PostgreSQL and Redis",
    ),
]
QUOTA = 500
CHATS_PER_PROCESS = 5
STREAMS_PER_PROCESS = 5
IN_FLIGHT = 2 * (CHATS_PER_PROCESS + STREAMS_PER_PROCESS)
ASKED = {"temperature": 0.0, "max_tokens": 200}  # 20 x 200 asked: far past the quota


@pytest.fixture(scope="module")
def quota_cluster(django_db_setup, django_db_blocker, cluster_model_dir, tmp_path_factory):  # noqa: F811
    with running_cluster(cluster_model_dir, tmp_path_factory, MAX_LIVE_PER_USER=str(IN_FLIGHT)) as processes:
        yield processes


async def chat_answer(process, cookie: str, owner) -> dict:  # noqa: F811
    conversation = await conversation_of(owner, **ASKED)
    tab = await Tab.open(process, cookie, conversation)
    await tab.send(type="send", content="Tell me a long story")
    answer_id = await tab.answer_id()
    final = await tab.finished(answer_id, timeout=240)
    notice = await tab.until("notice", timeout=10)
    await tab.close()
    return {**final, "notice": notice["text"]}


async def api_stream(http: httpx.AsyncClient, url: str, key: str, model: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        **ASKED,
    }
    finish, usage = None, None
    async with http.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    return {"finish_reason": finish, "completion_tokens": usage["completion_tokens"]}


async def test_a_500_token_quota_stops_chat_answers_and_api_streams_across_two_processes(
    quota_cluster,
    user,  # noqa: F811
    cookie,  # noqa: F811
):
    from tests.live_site import health_details

    a, b = quota_cluster
    await sync_to_async(forget_counters)()
    await TokenQuota.objects.acreate(user=user, completion_tokens_per_day=QUOTA)
    _key, raw = await sync_to_async(ApiKey.objects.create_key)(user)
    model = health_details(a.site.url)["engine"]["model"]

    async with httpx.AsyncClient(timeout=300) as http:
        chats = [chat_answer(p, cookie, user) for p in (a, b) for _ in range(CHATS_PER_PROCESS)]
        streams = [
            api_stream(http, p.site.url, raw, model) for p in (a, b) for _ in range(STREAMS_PER_PROCESS)
        ]
        results = await asyncio.gather(*chats, *streams)
        chat_results, stream_results = results[: len(chats)], results[len(chats) :]

        served = sum(r["completion_tokens"] for r in results)
        print(f"\nquota {QUOTA}: served {served} completion tokens in {IN_FLIGHT} requests on two processes")
        # Each running request gets at most one token per step: one step of both engines
        # together is at most IN_FLIGHT tokens.
        assert QUOTA <= served <= QUOTA + IN_FLIGHT
        assert {r["finish_reason"] for r in results} == {"length"}
        assert all(r["completion_tokens"] < ASKED["max_tokens"] for r in results)
        assert all("completion-token quota (500 tokens) has run out" in r["notice"] for r in chat_results)
        assert len(stream_results) == 2 * STREAMS_PER_PROCESS

        # Over budget: /v1 answers 429 with Retry-After and insufficient_quota, on either process.
        for process in (a, b):
            refused = await http.post(
                f"{process.site.url}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
                headers={"Authorization": f"Bearer {raw}"},
            )
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) > 0
            error = refused.json()["error"]
            assert error["code"] == "insufficient_quota" and "resets at" in error["message"]

    # And the chat says what ran out and when it resets.
    conversation = await conversation_of(user, **ASKED)
    tab = await Tab.open(b, cookie, conversation)
    await tab.send(type="send", content="One more")
    error = await tab.until("error")
    assert error["code"] == "quota_exhausted"
    assert "daily completion-token quota" in error["detail"] and "resets at" in error["detail"]
    await tab.close()
    exhausted = await AuditEvent.objects.filter(action="quota.exhausted", actor_id=user.pk).acount()
    assert exhausted >= 1
