"""/healthz reports database, channel layer and engine readiness as JSON."""

from __future__ import annotations

import pytest


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_healthz_reports_the_readiness_of_each_part(client):
    response = client.get("/healthz")
    body = response.json()
    assert body["database"]["ready"] is True
    assert body["channel_layer"]["ready"] is True
    assert body["engine"]["state"] in {"not_loaded", "loading", "ready", "error"}
    assert body["ok"] == (body["engine"]["ready"] and body["database"]["ready"])
    assert response.status_code == (200 if body["ok"] else 503)


@pytest.mark.django_db(transaction=True)
def test_healthz_needs_no_login(client):
    assert client.get("/healthz").status_code in {200, 503}
    assert "Location" not in client.get("/healthz")


@pytest.mark.django_db(transaction=True)
def test_healthz_is_503_until_the_engine_is_ready_and_200_after(client, monkeypatch):
    from conversations.ops import views

    monkeypatch.setattr(views, "engine_status", lambda: {"ready": False, "state": "loading"})
    response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["ok"] is False
    monkeypatch.setattr(views, "engine_status", lambda: {"ready": True, "state": "ready"})
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["ok"] is True


@pytest.mark.django_db(transaction=True)
def test_healthz_is_503_when_the_channel_layer_does_not_answer_in_time(client, monkeypatch):
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
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["channel_layer"] == {"ready": False, "detail": "no answer within 0.2 s"}


@pytest.mark.smoke
def test_livez_answers_200_while_the_process_serves_http(client):
    response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"ok": True}
