"""SIGTERM stops a real server in order, within ``SHUTDOWN_TIMEOUT_SECONDS``, while a grammar
compile, two long embedding requests and a document's extraction (eager Celery: in the
server process) are all in flight; no grammar worker process outlives it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from conversations.models import ApiKey, Document
from tests.chat.test_shutdown import start_site, terminate
from tests.conftest import session_cookie_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

SHUTDOWN_SECONDS = 6.0
SLACK_SECONDS = 4.0
# 150 patterns near the repetition cap (9 KB, within the size cap): tens of seconds of compiling.
SLOW_SCHEMA = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "pattern": f"^x{{{1000 - i}}}$"} for i in range(150)},
    "required": [f"p{i}" for i in range(150)],
}


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(c) for c in text)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def in_background(func, *args) -> threading.Thread:
    def run() -> None:
        try:
            func(*args)
        except httpx.HTTPError:
            pass  # the server went away mid-request: expected

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigterm_during_a_compile_embeddings_and_an_extraction(tiny_model_dir, tmp_path):
    user = get_user_model().objects.create(username="heavy-work")
    _key, raw = ApiKey.objects.create_key(user, name="heavy")
    site = start_site(
        tiny_model_dir,
        tmp_path,
        ("REDIS_URL",),  # eager Celery: the extraction runs in the server process
        SHUTDOWN_TIMEOUT_SECONDS=str(SHUTDOWN_SECONDS),
        API_GRAMMAR_COMPILE_TIMEOUT="300",
    )
    try:
        api = {"Authorization": f"Bearer {raw}"}
        model = httpx.get(f"{site.url}/v1/models", headers=api, timeout=30).json()["data"][0]["id"]

        def compile_request() -> None:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": SLOW_SCHEMA},
                },
            }
            httpx.post(f"{site.url}/v1/chat/completions", json=body, headers=api, timeout=300)

        def embedding_request(first: int) -> None:
            # 32,000 tokens (the tiny model's context is 2,048: inputs of 2,000).
            body = {"model": model, "input": [list(range(first + i, first + i + 2000)) for i in range(16)]}
            httpx.post(f"{site.url}/v1/embeddings", json=body, headers=api, timeout=300)

        cookie = session_cookie_for(user).decode()
        name, _, value = cookie.partition("=")
        with httpx.Client(base_url=site.url, cookies={name: value}, timeout=60) as browser:
            browser.get("/settings/documents/")
            token = browser.cookies[settings.CSRF_COOKIE_NAME]
            text = "\n\n".join(f"Paragraph {i}: the keeper trims the wick at dusk." * 4 for i in range(4000))
            upload = browser.post(
                "/documents/upload/",
                files={"file": ("notes.txt", text.encode())},
                headers={"X-CSRFToken": token, "Referer": site.url + "/settings/documents/"},
            )
        assert upload.status_code == 201, upload.text
        document_id = upload.json()["document"]["id"]

        in_background(compile_request)
        deadline = time.monotonic() + 120
        while not children(site.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = children(site.process.pid)
        assert workers, "no grammar worker process started"
        time.sleep(15)  # the worker has loaded xgrammar (seconds on a busy machine) and is compiling
        in_background(embedding_request, 10)
        in_background(embedding_request, 20)
        time.sleep(2)
        assert Document.objects.get(pk=document_id).status == Document.Status.EXTRACTING
        stopped_in = terminate(site)
    finally:
        if site.process.poll() is None:
            site.process.kill()
    log = site.log()
    print(f"stopped {stopped_in:.2f} s after SIGTERM (exit status {site.process.returncode})")
    assert stopped_in < SHUTDOWN_SECONDS + SLACK_SECONDS, log[-4000:]
    assert "forcing exit" not in log, log[-4000:]  # the work let go: the watchdog was not needed
    time.sleep(1)
    assert not [pid for pid in workers if alive(pid)], "a grammar worker outlived the server"
