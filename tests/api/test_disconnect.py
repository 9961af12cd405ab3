"""A client that goes away mid-answer, streaming or not, frees its engine request at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.api.conftest import chat, wait_for_rows, wait_for_stats, wait_until_idle
from tests.live_site import health_details, start_slow_live_site, stop_live_site

pytestmark = pytest.mark.timeout(120)

LONG = 1500  # tokens: at least 15 s on this module's site, so only an abort ends the request this soon
IDLE_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def live_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """A site whose every forward pass takes at least 10 ms: the tiny model alone can finish
    LONG tokens before the client gives up."""
    site = start_slow_live_site(tiny_model_dir, tmp_path_factory.mktemp("slow-site"))
    yield site
    stop_live_site(site)


@pytest.fixture(scope="module")
def model_name(live_site) -> str:
    return health_details(live_site.url)["engine"]["model"]


def assert_back_to_idle(site, idle: dict) -> None:
    started = time.monotonic()
    after = wait_until_idle(site, timeout=IDLE_WITHIN_S)
    assert time.monotonic() - started < IDLE_WITHIN_S
    assert after["running"] == 0 and after["waiting"] == 0
    assert after["kv_blocks_used"] == idle["kv_blocks_used"]


@pytest.mark.smoke
def test_a_stream_disconnect_aborts_the_engine_request_and_frees_its_blocks(
    live_site, api_key, model_name, api_user
):
    idle = wait_until_idle(live_site)
    body = {"model": model_name, "messages": chat(), "max_tokens": LONG, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream(
            "POST",
            f"{live_site.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {api_key}"},
        ) as response:
            chunks = response.iter_raw()
            assert next(chunks).startswith(b"data: ")
            busy = wait_for_stats(
                live_site, lambda s: s["running"] == 1 and s["kv_blocks_used"] > idle["kv_blocks_used"]
            )
            assert busy["running"] == 1
        # Leaving the block closes the connection mid-stream.
    assert_back_to_idle(live_site, idle)
    [row] = wait_for_rows(api_user, 1)
    assert (row.status_code, row.finish_reason, row.stream) == (499, "abort", True)
    assert row.completion_tokens < LONG


def test_a_non_stream_disconnect_aborts_the_engine_request_and_frees_its_blocks(
    live_site, api_key, model_name, api_user
):
    idle = wait_until_idle(live_site)
    impatient = openai.OpenAI(base_url=f"{live_site.url}/v1", api_key=api_key, max_retries=0, timeout=2.0)

    def ask():
        return impatient.chat.completions.create(
            model=model_name, messages=chat(), max_tokens=LONG, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(1) as pool, impatient:
        future = pool.submit(ask)
        wait_for_stats(live_site, lambda s: s["running"] == 1)
        with pytest.raises(openai.APITimeoutError):
            future.result()  # the client gives up and closes the connection
    assert_back_to_idle(live_site, idle)
    [row] = wait_for_rows(api_user, 1)
    assert (row.status_code, row.finish_reason, row.stream) == (499, "abort", False)
    assert row.completion_tokens < LONG
