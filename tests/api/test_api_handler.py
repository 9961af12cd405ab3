"""The JSON API's lean ASGI handler (conversations.api.handler) keeps the site's response
headers and host check; the HTML docs page keeps the full browser stack."""

from __future__ import annotations

import httpx
import pytest

from conversations.api.handler import is_api_call
from tests.api.conftest import chat

pytestmark = pytest.mark.timeout(120)


def test_only_json_api_paths_take_the_lean_handler():
    assert is_api_call({"path": "/v1/chat/completions"})
    assert is_api_call({"path": "/v1/models"})
    assert not is_api_call({"path": "/v1/docs"})
    assert not is_api_call({"path": "/settings/api-keys/"})
    assert not is_api_call({"path": "/"})


def test_an_api_response_has_the_sites_security_headers_and_sets_no_cookie(live_site, api_key, model_name):
    response = httpx.post(
        f"{live_site.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": model_name, "messages": chat(), "max_tokens": 2, "stream": True},
        timeout=60,
    )
    assert response.status_code == 200
    assert response.text.endswith("data: [DONE]\n\n")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "set-cookie" not in response.headers


def test_an_api_call_for_a_host_not_allowed_is_refused(live_site, api_key):
    response = httpx.get(
        f"{live_site.url}/v1/models",
        headers={"Authorization": f"Bearer {api_key}", "Host": "evil.example"},
        timeout=30,
    )
    assert response.status_code == 400


def test_the_docs_page_keeps_the_content_security_policy(live_site):
    response = httpx.get(f"{live_site.url}/v1/docs", timeout=30)
    assert response.status_code == 200
    assert "Content-Security-Policy" in response.headers
