"""/healthz reports database, channel layer and engine readiness as JSON: to anyone, only
whether each check passes; the details to the callers /metrics admits."""

from __future__ import annotations

import pytest

TOKEN = "a-metrics-token-for-tests"
BUSY_ENGINE = {
    "ready": True,
    "state": "ready",
    "model": "secret-model-name",
    "stats": {"running": 3, "waiting": 7, "prefix_hit_rate": 0.5, "ttft": {"buckets": [0.1], "counts": [4]}},
}


@pytest.fixture
def busy_engine(monkeypatch):
    from conversations.ops import views

    monkeypatch.setattr(views, "engine_status", lambda: BUSY_ENGINE)


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_healthz_reports_the_readiness_of_each_part(client):
    response = client.get("/healthz")
    body = response.json()
    assert body["checks"]["database"] is True
    assert body["checks"]["channel_layer"] is True
    assert isinstance(body["checks"]["engine"], bool)
    ok = all(body["checks"].values())
    assert body["status"] == ("ok" if ok else "unavailable")
    assert response.status_code == (200 if ok else 503)


@pytest.mark.django_db(transaction=True)
def test_healthz_needs_no_login(client):
    assert client.get("/healthz").status_code in {200, 503}
    assert "Location" not in client.get("/healthz")


@pytest.mark.django_db(transaction=True)
def test_healthz_tells_anonymous_callers_only_whether_each_check_passes(client, busy_engine, settings):
    settings.METRICS_TOKEN = TOKEN
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        response = client.get("/healthz", headers=headers)
        assert response.status_code == 200
        body = response.json()
        assert body == {"status": "ok", "checks": {"database": True, "channel_layer": True, "engine": True}}
        assert "secret-model-name" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_healthz_tells_a_signed_in_user_who_is_not_staff_no_more(client, busy_engine, make_user):
    client.force_login(make_user("plain"))
    assert set(client.get("/healthz").json()) == {"status", "checks"}


@pytest.mark.django_db(transaction=True)
def test_healthz_gives_the_details_to_the_metrics_token_and_to_staff(
    client, busy_engine, make_user, settings
):
    settings.METRICS_TOKEN = TOKEN
    details = client.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"}).json()["details"]
    assert details["engine"] == BUSY_ENGINE
    assert details["database"] and details["channel_layer"]
    assert set(details["process"]) == {"id", "cluster"}

    settings.METRICS_TOKEN = ""  # the same rule as /metrics: staff sessions always can
    staff = make_user("staff")
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    assert client.get("/healthz").json()["details"]["engine"]["stats"]["waiting"] == 7


@pytest.mark.django_db(transaction=True)
def test_healthz_is_503_until_the_engine_is_ready_and_200_after(client, monkeypatch):
    from conversations.ops import views

    monkeypatch.setattr(views, "engine_status", lambda: {"ready": False, "state": "loading"})
    response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["status"] == "unavailable"
    assert response.json()["checks"]["engine"] is False
    monkeypatch.setattr(views, "engine_status", lambda: {"ready": True, "state": "ready"})
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


@pytest.mark.django_db(transaction=True)
def test_healthz_is_503_when_the_channel_layer_does_not_answer_in_time(client, monkeypatch, settings):
    import asyncio

    from conversations.ops import health, views

    class HangingLayer:
        async def new_channel(self):
            return "health.x"

        async def send(self, channel, message):
            pass

        async def receive(self, channel):
            await asyncio.sleep(3600)

    monkeypatch.setattr(health, "get_channel_layer", lambda: HangingLayer())
    monkeypatch.setattr(health, "CHANNEL_LAYER_TIMEOUT_S", 0.2)
    monkeypatch.setattr(views, "engine_status", lambda: {"ready": True, "state": "ready"})
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 503
    assert response.json()["checks"]["channel_layer"] is False
    assert response.json()["details"]["channel_layer"] == "no answer within 0.2 s"


@pytest.mark.smoke
def test_livez_answers_200_while_the_process_serves_http(client):
    response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
