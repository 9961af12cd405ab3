"""Usage aggregates: finished requests add up into one row per day, user, model and source,
and the time to first token's percentiles come from the summed buckets; the pages need a
sign-in (the admin's, staff)."""

from __future__ import annotations

import pytest
from django.test import Client

from conversations.models import UsageDay
from conversations.usage import record
from conversations.usage.figures import percentile_of, user_charts

pytestmark = pytest.mark.django_db


def finished(user_id: int, completion: int, ttft_ms: float | None) -> record.Finished:
    return record.Finished(user_id, "tiny", "chat", 10, completion, 4, ttft_ms)


def test_finished_requests_add_up_in_their_days_row(make_user):
    user = make_user("nia")
    record.add(finished(user.pk, 5, 120.0))
    record.add(finished(user.pk, 7, 30.0))
    record.add(record.Finished(user.pk, "tiny", "api", 3, 2, 0, None))
    chat = UsageDay.objects.get(user=user, source="chat")
    assert (chat.requests, chat.prompt_tokens, chat.completion_tokens, chat.cached_tokens) == (2, 20, 12, 8)
    assert (chat.ttft_b0, chat.ttft_b2) == (1, 1)  # under 50 ms, 100-200 ms
    assert UsageDay.objects.get(user=user, source="api").requests == 1
    [tokens, requests] = user_charts(user.pk)
    assert tokens.series["completion tokens"][-1] == 14 and requests.series["requests"][-1] == 3
    assert tokens.svg.count("<rect") == 2  # today's prompt and completion bars


def test_percentiles_from_buckets():
    buckets = [0, 90, 0, 0, 0, 10, 0, 0, 0, 0, 0]
    assert percentile_of(buckets, 0.5) == 100.0 and percentile_of(buckets, 0.95) == 1600.0
    assert percentile_of([0] * 11, 0.5) is None


def test_the_pages_need_a_sign_in_and_the_admins_staff(make_user):
    assert Client().get("/settings/usage/").status_code == 302
    client = Client()
    client.force_login(make_user("ola"))
    page = client.get("/settings/usage/")
    assert page.status_code == 200 and page.content.count(b'class="usage-chart"') == 2
    assert b"<caption>Your tokens per day" in page.content  # the table beside each chart
    assert client.get("/admin/usage/").status_code == 302  # not staff: the admin's sign-in
