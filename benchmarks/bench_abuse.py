"""Eight streaming chats against a live site, alone and while the heavy requests of the
security review are attempted against it: their inter-token p99, and what each attempt got.

One Daphne process (started here, on a temporary SQLite database, eager Celery) serves the
default model (SmolLM2-135M, or ``--model``). Eight ``/v1/chat/completions`` streams of
``--tokens`` tokens each run twice: alone (the baseline), then while these are sent:

- embeddings: three requests of 32,000 token ids each (inputs cut to the model's context);
- uploads: a 600 KB text file (read and embedded in the server process) and a padded DOCX
  bomb (858 KB inflating to 151 MB of empty paragraphs);
- grammars: ``^a{30000}$`` and ``^b{30000}$`` as guided regexes, a schema of 150 patterns
  near the repetition cap (tens of seconds of compiling), and an 840 KB schema of 12,000
  patterned properties;
- stop strings: sixteen of 60,000 characters.

The gap between two content chunks of a stream is one inter-token interval (a chunk
carries the tokens of one hand-over, about 30 ms of them). It prints p50/p99/max of the
gaps in both phases and their ratio, the machine's one-minute load average as each phase
starts, and each attempt's status and time.

On a shared machine the figures move with its load: compare the ratio, and say so.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_abuse.py [--model DIR] [--tokens 300]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_cluster import setup_django  # noqa: E402
from benchmarks.bench_serving import launch, percentile  # noqa: E402

STREAMS = 8
ATTEMPTS_GRACE_S = 30.0


async def stream_gaps(client, model: str, tokens: int, index: int) -> list[float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell story number {index} about a lighthouse."}],
        "max_tokens": tokens,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream": True,
    }
    gaps: list[float] = []
    last: float | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices") or not chunk["choices"][0]["delta"].get("content"):
                continue
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps


async def chats(client, model: str, tokens: int) -> list[float]:
    results = await asyncio.gather(*(stream_gaps(client, model, tokens, i) for i in range(STREAMS)))
    return [g for gaps in results for g in gaps]


def padded_docx_bomb(xml_bytes: int = 151_000_000) -> bytes:
    head = (
        b'<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
        b'wordprocessingml/2006/main"><w:body>'
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as member:
            member.write(head)
            chunk = b"<w:p/>" * 100_000
            for _ in range(xml_bytes // len(chunk)):
                member.write(chunk)
            member.write(b"</w:body></w:document>")
        archive.writestr("word/media/pad.bin", os.urandom(xml_bytes // 176), compress_type=zipfile.ZIP_STORED)
    return out.getvalue()


def attempts(model: str, context: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, JSON body) of each API attempt."""
    per_input = min(8000, context - 16)
    ids = [list(range(100 + i, 100 + i + per_input)) for i in range(32_000 // per_input)]
    slow_schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^x{{{1000 - i}}}$"} for i in range(150)},
    }
    big_schema = {
        "type": "object",
        "properties": {
            f"field_{i}": {"type": "string", "pattern": f"^[a-z]{{1,{i % 50 + 1}}}[0-9]*$", "maxLength": 64}
            for i in range(12_000)
        },
    }
    chat = [{"role": "user", "content": "hi"}]

    def completion(**extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": chat, "max_tokens": 8, **extra}

    def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}

    return [
        *[(f"embeddings 32k #{i}", "/v1/embeddings", {"model": model, "input": ids}) for i in range(3)],
        ("regex a{30000}", "/v1/chat/completions", completion(guided_regex="^a{30000}$")),
        ("regex b{30000}", "/v1/chat/completions", completion(guided_regex="^b{30000}$")),
        (
            "schema of 150 patterns",
            "/v1/chat/completions",
            completion(response_format=schema_format(slow_schema)),
        ),
        ("840 KB schema", "/v1/chat/completions", completion(response_format=schema_format(big_schema))),
        ("16 stops x 60k chars", "/v1/chat/completions", completion(stop=["z" * 60_000] * 16)),
    ]


async def attempt_api(client, name: str, path: str, body: dict[str, Any]) -> str:
    started = time.monotonic()
    try:
        response = await client.post(path, json=body, timeout=600)
        status = str(response.status_code)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        status = type(exc).__name__
    return f"{name:<28} {status:>6}  {time.monotonic() - started:7.2f} s"


async def attempt_upload(browser, name: str, filename: str, data: bytes) -> str:
    started = time.monotonic()
    token = browser.cookies.get("csrftoken", "")
    try:
        response = await browser.post(
            "/documents/upload/",
            files={"file": (filename, data)},
            headers={"X-CSRFToken": token, "Referer": str(browser.base_url) + "/settings/documents/"},
            timeout=600,
        )
        status = str(response.status_code)
    except Exception as exc:  # noqa: BLE001
        status = type(exc).__name__
    return f"{name:<28} {status:>6}  {time.monotonic() - started:7.2f} s"


def summary(label: str, gaps: list[float]) -> str:
    return (
        f"{label:<18} gaps {len(gaps):5d}  p50 {percentile(gaps, 0.5) * 1000:7.1f} ms  "
        f"p99 {percentile(gaps, 0.99) * 1000:7.1f} ms  max {max(gaps) * 1000:7.1f} ms"
    )


async def run(site, key: str, session: dict[str, str], tokens: int) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=site.url, headers=headers, timeout=600) as client,
        httpx.AsyncClient(base_url=site.url, cookies=session, timeout=600) as browser,
    ):
        models = (await client.get("/v1/models")).json()["data"]
        model, context = models[0]["id"], int(models[0].get("max_model_len") or 2048)
        await chats(client, model, 16)  # warm-up
        load_alone = os.getloadavg()[0]
        baseline = await chats(client, model, tokens)
        print(summary("alone", baseline) + f"  (load average {load_alone:.1f})", flush=True)
        await browser.get("/settings/documents/")
        text = "\n\n".join(f"Paragraph {i}: the keeper trims the wick at dusk." * 4 for i in range(3000))
        bomb = padded_docx_bomb()
        chat_task = asyncio.create_task(chats(client, model, tokens))
        await asyncio.sleep(1.0)  # the streams are under way
        jobs = {name: attempt_api(client, name, path, body) for name, path, body in attempts(model, context)}
        jobs["upload 600 KB text"] = attempt_upload(browser, "upload 600 KB text", "notes.txt", text.encode())
        jobs["upload padded DOCX bomb"] = attempt_upload(
            browser, "upload padded DOCX bomb", "bomb.docx", bomb
        )
        attack = {name: asyncio.create_task(job) for name, job in jobs.items()}
        load_attacked = os.getloadavg()[0]
        loaded = await chat_task
        print(summary("under attempts", loaded) + f"  (load average {load_attacked:.1f})", flush=True)
        print(
            f"p99 ratio (under attempts / alone): {percentile(loaded, 0.99) / percentile(baseline, 0.99):.2f}"
        )
        # Background work (a long embedding yields to the streams) may outlast them: it is
        # reported as such and cancelled, which is also what a client that gives up does.
        await asyncio.wait(attack.values(), timeout=ATTEMPTS_GRACE_S)
        for name, task in attack.items():
            if task.done():
                print("  " + task.result())
            else:
                task.cancel()
                print(f"  {name:<28} still running {ATTEMPTS_GRACE_S:g} s after the streams; cancelled")


def ready_within(site, seconds: float) -> None:
    from tests.live_site import health_details

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if site.process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{site.log()[-3000:]}")
        try:
            if health_details(site.url, timeout=5)["engine"]["ready"]:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not ready within {seconds:g} s:\n{site.log()[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="a model directory (default: SmolLM2-135M)")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per chat stream")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-abuse-"))
    setup_django(work / "db.sqlite3")
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.conftest import session_cookie_for
    from tests.live_site import stop_live_site

    user = get_user_model().objects.create_user(f"bench-{uuid.uuid4().hex[:8]}", password="a-long-pass-42")
    _, key = ApiKey.objects.create_key(user, "bench")
    name, _, value = session_cookie_for(user).decode().partition("=")
    env = {"API_RATE_LIMIT_PER_MINUTE": "100000", "TITLES_FROM_MODEL": "false"}
    if args.model:
        env["ENGINE_MODEL"] = args.model
    env.pop("REDIS_URL", None)
    os.environ.pop("REDIS_URL", None)  # eager Celery: uploads are read in the server process
    site = launch(work, env)
    ready_within(site, 900)  # the first load of the default GGUF converts its weights
    print(f"server pid {site.process.pid} at {site.url}; log {site.log_path}", flush=True)
    try:
        asyncio.run(run(site, key, {name: value}, args.tokens))
    finally:
        stop_live_site(site)


if __name__ == "__main__":
    main()
