"""What vLLM's benchmark clients (guidellm, vLLM's own) rely on: ``GET /health`` answering
200 with an empty body, and ``stream_options.continuous_usage_stats`` (usage on every chunk)."""

from __future__ import annotations

import httpx
import pytest

from conversations.ops import engine_handle
from tests.api.conftest import chat, parse_sse

pytestmark = pytest.mark.timeout(120)

UNTIL_MAX = {"ignore_eos": True}  # a random-weight model may emit EOS at any point


@pytest.mark.smoke
def test_health_is_status_only(client, monkeypatch):
    response = client.get("/health")
    assert response.status_code == 200 and response.content == b""
    for state in ("error", "stopped"):
        monkeypatch.setattr(engine_handle.slot_for(None), "state", state)
        assert client.get("/health").status_code == 503


def test_health_of_a_live_site_needs_no_credentials(live_site):
    response = httpx.get(f"{live_site.url}/health", timeout=10)
    assert response.status_code == 200 and response.content == b""


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(openai_client, model_name):
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=chat(),
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body=UNTIL_MAX,
    )
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    *content, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 7
    prompt_tokens = {c.usage.prompt_tokens for c in chunks}
    assert len(prompt_tokens) == 1 and prompt_tokens.pop() > 0
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 7  # the role chunk comes first
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)


def test_continuous_usage_stats_alone_adds_no_usage_chunk(live_site, api_key, model_name):
    body = {
        "model": model_name,
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
        **UNTIL_MAX,
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.stream("POST", f"{live_site.url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        events = parse_sse(r.read().decode())
    assert all(e["choices"] and e["usage"]["completion_tokens"] <= 5 for e in events)
    assert (
        events[-1]["usage"]["completion_tokens"] == 5
        and events[-1]["choices"][0]["finish_reason"] == "length"
    )
