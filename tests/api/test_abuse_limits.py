"""Per-key rate limit (429 + Retry-After, OpenAI's shape) and the fan-out cap (400),
checked in process: both answer before the engine is involved."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from conversations.models import ApiKey
from tests.support.api_engine import serve_no_engine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_engine(monkeypatch):
    """Calls that get past the limits end at once with a 503 instead of loading a model."""

    serve_no_engine(monkeypatch)


def new_key(make_user, **fields) -> tuple[ApiKey, str]:
    key, raw = ApiKey.objects.create_key(make_user(), name="limits")
    if fields:
        ApiKey.objects.filter(pk=key.pk).update(**fields)
    return key, raw


def get_models(client, raw: str):
    return client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.mark.smoke
@override_settings(API_RATE_LIMIT_PER_MINUTE=3)
def test_a_key_over_its_rate_limit_gets_429_with_retry_after_in_openai_shape(client, make_user, no_engine):
    _key, raw = new_key(make_user)
    statuses = [get_models(client, raw).status_code for _ in range(3)]
    assert statuses == [503, 503, 503]  # under the limit: through to the (absent) engine
    response = get_models(client, raw)
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 60
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert set(error) == {"message", "type", "param", "code"}


@override_settings(API_RATE_LIMIT_PER_MINUTE=5)
async def test_calls_at_once_are_counted_one_by_one(make_user, no_engine):
    """Twenty calls in flight together, through the API's own handler and its worker threads:
    five get through, fifteen get a 429 (a count read and written back in two steps would
    let them all through)."""
    from conversations.api.handler import ApiHandler

    _key, raw = await sync_to_async(new_key)(make_user)
    transport = httpx2.ASGITransport(app=ApiHandler())
    async with httpx2.AsyncClient(transport=transport, base_url="http://testserver") as http:
        responses = await asyncio.gather(
            *[http.get("/v1/models", headers={"Authorization": f"Bearer {raw}"}) for _ in range(20)]
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [429] * 15 + [503] * 5


@override_settings(API_RATE_LIMIT_PER_MINUTE=2)
def test_keys_are_limited_separately(client, make_user, no_engine):
    _a, raw_a = new_key(make_user)
    _b, raw_b = new_key(lambda: make_user("other-user"))
    for _ in range(2):
        get_models(client, raw_a)
    assert get_models(client, raw_a).status_code == 429
    assert get_models(client, raw_b).status_code == 503


@override_settings(API_RATE_LIMIT_PER_MINUTE=100)
def test_an_admin_set_limit_on_a_key_overrides_the_site_default(client, make_user, no_engine):
    _key, raw = new_key(make_user, rate_limit_per_minute=1)
    assert get_models(client, raw).status_code == 503
    assert get_models(client, raw).status_code == 429


def test_the_admin_can_edit_a_keys_rate_limit(client, make_user):
    admin = make_user("admin-user")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    key, _raw = ApiKey.objects.create_key(admin, name="k")
    client.force_login(admin)
    page = client.get(f"/admin/conversations/apikey/{key.pk}/change/")
    assert b'name="rate_limit_per_minute"' in page.content
    response = client.post(
        f"/admin/conversations/apikey/{key.pk}/change/", {"name": "k", "rate_limit_per_minute": "7"}
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.rate_limit_per_minute == 7


@pytest.mark.smoke
@override_settings(API_MAX_SEQUENCES_PER_REQUEST=4)
@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 2}),
        ("/v1/completions", {"prompt": [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 5}),
    ],
)
def test_more_sequences_than_the_fan_out_cap_is_a_400_before_anything_is_queued(
    client, make_user, no_engine, path, body
):
    _key, raw = new_key(make_user)
    response = client.post(
        path,
        {"model": "any", **body},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n" and error["code"] == "too_many_sequences"


@override_settings(API_MAX_SEQUENCES_PER_REQUEST=4)
def test_a_request_within_the_fan_out_cap_goes_on_to_the_engine(client, make_user, no_engine):
    _key, raw = new_key(make_user)
    response = client.post(
        "/v1/completions",
        {"model": "any", "prompt": ["a", "b"], "n": 2},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 503
