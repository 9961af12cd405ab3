"""Usage rows: the calls that finish together are recorded together, each with its own row."""

from __future__ import annotations

import asyncio

import pytest

from conversations.api.usage import RequestLog, wait_for_pending
from conversations.models import ApiKey, ApiRequest


@pytest.mark.django_db(transaction=True)
def test_calls_finishing_together_each_get_a_row_and_mark_their_key_used(make_user):
    user = make_user("usage-batch")
    keys = [ApiKey.objects.create_key(user, name=f"k{i}")[0] for i in range(2)]

    async def finish_many() -> None:
        for i in range(7):
            log = RequestLog(key=keys[i % 2], endpoint="/v1/chat/completions", request_id=f"r{i}")
            log.finish(200, completion_tokens=i, finish_reason="length")
        await wait_for_pending()

    asyncio.run(finish_many())
    rows = ApiRequest.objects.filter(owner=user).order_by("id")
    assert [r.request_id for r in rows] == [f"r{i}" for i in range(7)]
    assert [r.completion_tokens for r in rows] == list(range(7))
    assert [r.key_id for r in rows] == [keys[i % 2].pk for i in range(7)]
    assert all(k.last_used_at is not None for k in ApiKey.objects.filter(owner=user))
