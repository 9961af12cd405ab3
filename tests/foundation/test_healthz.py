"""/healthz reports database, channel layer and engine readiness as JSON."""

from __future__ import annotations

import pytest


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_healthz_answers_200_with_the_readiness_of_each_part(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"]["ready"] is True
    assert body["channel_layer"]["ready"] is True
    assert body["engine"]["state"] in {"not_loaded", "loading", "ready", "error"}
    assert body["ok"] == (body["engine"]["ready"] and body["database"]["ready"])


@pytest.mark.django_db(transaction=True)
def test_healthz_needs_no_login(client):
    assert client.get("/healthz").status_code == 200
