"""Many multi-turn chats at once: our site against llama.cpp's ``llama-server``, one after the other.

The workload follows vLLM's multi-turn benchmark (``benchmarks.multiturn_workload``): a shared
250-word system prompt, then a 600-word document per conversation; user turns of ~40 words,
answers of 48 tokens at temperature 0 (EOS ignored on both servers, so both write the same
number of tokens), clients started ``--stagger`` seconds apart, ``--think`` seconds between a
client's answer and its next turn. Every turn re-sends the whole history with the previous
answers, through the official ``openai`` client, streaming.

Ours: one Daphne process as the Procfile runs it (``bench_serving.launch``) on a temporary
SQLite database, the default model (SmolLM2-135M-Instruct Q4_1 GGUF), ``--threads`` threads.
Theirs: ``llama-server`` (``scripts/build-llama-server`` builds it from the llama-cpp-python
sdist's llama.cpp) on the same GGUF, one slot per client with 4,096 tokens each, the same
threads, its prompt cache on (its default). ``--ws`` also runs the same conversations through
the chat websocket (one conversation per client, the system prompt as the conversation's).

It prints, per server: TTFT p50/p90 by turn, warm-turn (2nd on) and first-turn TTFT p50,
inter-token p50/p99, output tokens/s; then ours/theirs ratios (their time over ours, our
throughput over theirs) and the load average before and after each run.

    scripts/build-llama-server /opt/llama-server
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_multiturn.py --clients 16 --turns 4 \\
        [--llama-server /opt/llama-server/bin/llama-server] [--only ours|llama] [--ws] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.multiturn_workload import (  # noqa: E402
    Conversation,
    TurnRecord,
    Workload,
    build_conversations,
    summarise,
)

DEFAULT_LLAMA_SERVER = "/opt/llama-server/bin/llama-server"
SLOT_CONTEXT = 4096


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the clients ---------------------------------------------------------------------------


async def openai_client_turns(
    client: Any, model: str, index: int, chat: Conversation, load: Workload, records: list[TurnRecord]
) -> None:
    await asyncio.sleep(index * load.stagger_s)
    messages: list[dict[str, str]] = [{"role": "system", "content": chat.system}]
    for turn, text in enumerate(chat.user_turns):
        messages.append({"role": "user", "content": text})
        record = TurnRecord(client=index, turn=turn, sent=time.monotonic())
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=load.answer_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        parts: list[str] = []
        async for chunk in stream:
            if chunk.usage is not None:
                record.output_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    now = time.monotonic()
                    record.first_token = record.first_token or now
                    record.token_times.append(now)
                    parts.append(choice.delta.content)
        record.finished = time.monotonic()
        record.text = "".join(parts)
        record.output_tokens = record.output_tokens or len(record.token_times)
        records.append(record)
        messages.append({"role": "assistant", "content": record.text})
        await asyncio.sleep(load.think_s)


async def drive_openai(base_url: str, key: str, model: str, load: Workload) -> dict[str, Any]:
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=load.clients * 2, max_keepalive_connections=load.clients * 2)
    http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0))
    client = AsyncOpenAI(base_url=base_url, api_key=key, http_client=http, max_retries=0)
    records: list[TurnRecord] = []
    start = time.monotonic()
    chats = build_conversations(load)
    await asyncio.gather(
        *(openai_client_turns(client, model, i, chat, load, records) for i, chat in enumerate(chats))
    )
    wall = time.monotonic() - start
    await http.aclose()
    return summarise(records, wall)


async def websocket_turns(
    url: str, cookie: str, conversation_id: int, index: int, chat: Conversation, load: Workload, records: list
) -> None:
    import websockets

    await asyncio.sleep(index * load.stagger_s)
    ws_url = url.replace("http://", "ws://") + f"/ws/chat/{conversation_id}/"
    headers = {"Cookie": cookie, "Origin": url}
    async with websockets.connect(ws_url, additional_headers=headers, max_size=None, open_timeout=120) as ws:
        while json.loads(await ws.recv())["type"] != "thread":
            pass
        for turn, text in enumerate(chat.user_turns):
            record = TurnRecord(client=index, turn=turn, sent=time.monotonic())
            await ws.send(json.dumps({"type": "send", "content": text}))
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "delta" and event.get("text"):
                    now = time.monotonic()
                    record.first_token = record.first_token or now
                    record.token_times.append(now)
                elif event["type"] == "finished":
                    record.output_tokens = event["message"].get("completion_tokens") or 0
                    break
                elif event["type"] == "error":
                    raise RuntimeError(f"chat error: {event}")
            record.finished = time.monotonic()
            records.append(record)
            await asyncio.sleep(load.think_s)


def make_chat_conversations(load: Workload, chats: list[Conversation]) -> list[tuple[int, str]]:
    from django.contrib.auth import get_user_model

    from conversations.models import Conversation as ChatConversation
    from tests.conftest import session_cookie_for

    tag = uuid.uuid4().hex[:8]
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"multiturn-{tag}-{i}") for i in range(load.clients)]
    )
    made = ChatConversation.objects.bulk_create(
        [
            ChatConversation(
                owner=user, system_prompt=chat.system, max_tokens=load.answer_tokens, temperature=0, top_p=1.0
            )
            for user, chat in zip(users, chats, strict=True)
        ]
    )
    return [(c.pk, session_cookie_for(u).decode()) for c, u in zip(made, users, strict=True)]


async def drive_websocket(url: str, targets: list[tuple[int, str]], load: Workload) -> dict[str, Any]:
    records: list[TurnRecord] = []
    chats = build_conversations(load)
    start = time.monotonic()
    await asyncio.gather(
        *(
            websocket_turns(url, cookie, cid, i, chat, load, records)
            for i, ((cid, cookie), chat) in enumerate(zip(targets, chats, strict=True))
        )
    )
    return summarise(records, time.monotonic() - start)


# --- the servers ---------------------------------------------------------------------------


def wait_for_engine(site: Any, seconds: float = 900) -> Any:
    """``tests.live_site.wait_until_ready`` with room for a loaded machine (the first start
    also compiles the C kernels)."""
    import httpx

    from tests.live_site import health_details, stop_live_site

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if site.process.poll() is not None:
            raise RuntimeError(f"daphne exited with {site.process.returncode}:\n{site.log()}")
        try:
            if health_details(site.url, timeout=5)["engine"]["ready"]:
                return site
        except (httpx.HTTPError, KeyError):
            pass
        time.sleep(1)
    stop_live_site(site)
    raise RuntimeError(f"daphne did not become ready:\n{site.log()}")


def run_ours(
    load: Workload, threads: int, websocket: bool, work: Path, wait_policy: str
) -> dict[str, dict[str, Any]]:
    from benchmarks.bench_cluster import setup_django
    from benchmarks.bench_serving import launch

    setup_django(work / "db.sqlite3")
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.live_site import health_details, stop_live_site

    user = get_user_model().objects.create_user(
        f"multiturn-{uuid.uuid4().hex[:8]}", password="a-long-pass-42"
    )
    _, key = ApiKey.objects.create_key(user, "multiturn")
    env = {
        "API_RATE_LIMIT_PER_MINUTE": "0",
        "MAX_LIVE_PER_USER": "100000",
        "LOG_LEVEL": "WARNING",
        "OMP_NUM_THREADS": str(threads),
        "TITLES_FROM_MODEL": "false",
    }
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy
    site = wait_for_engine(launch(work, env))
    results: dict[str, dict[str, Any]] = {}
    try:
        model = health_details(site.url)["engine"]["model"]
        results["ours"] = asyncio.run(drive_openai(site.url + "/v1", key, model, load))
        results["ours"]["load_after"] = load_average()
        if websocket:
            targets = make_chat_conversations(load, build_conversations(load))
            results["ours (websocket)"] = asyncio.run(drive_websocket(site.url, targets, load))
            results["ours (websocket)"]["load_after"] = load_average()
    finally:
        stop_live_site(site)
    return results


def run_llama_server(
    binary: str, gguf: str, load: Workload, threads: int, work: Path, wait_policy: str
) -> dict[str, Any]:
    import httpx

    from tests.live_site import free_port

    port = free_port()
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-np", str(load.clients), "-c", str(SLOT_CONTEXT * load.clients)]
    argv += ["-t", str(threads), "-tb", str(threads), "--cache-prompt", "--no-webui"]
    if wait_policy != "default":  # its threads' spin, as ours
        argv += ["--poll", "0" if wait_policy == "passive" else "50"]
    log = (work / "llama-server.log").open("w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited:\n{(work / 'llama-server.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become ready")
            time.sleep(0.5)
        result = asyncio.run(drive_openai(f"http://127.0.0.1:{port}/v1", "none", "smollm2", load))
        result["load_after"] = load_average()
        return result
    finally:
        process.terminate()
        process.wait(timeout=30)


# --- the report ----------------------------------------------------------------------------


def print_result(name: str, result: dict[str, Any], load_before: str) -> None:
    by_turn = ", ".join(
        f"{turn + 1}: {v['p50']:.2f}/{v['p90']:.2f}" for turn, v in result["ttft_by_turn"].items()
    )
    print(f"{name}: load {load_before} -> {result['load_after']}")
    print(f"  TTFT p50/p90 s by turn: {by_turn}")
    print(
        f"  warm-turn TTFT p50 {result['warm_ttft_p50']:.3f} s, p90 {result['warm_ttft_p90']:.3f} s; "
        f"first turn p50 {result['first_turn_ttft_p50']:.3f} s"
    )
    print(
        f"  inter-token p50 {result['itl_p50'] * 1000:.1f} ms, p99 {result['itl_p99'] * 1000:.1f} ms; "
        f"per output token p50 {result['tpot_p50'] * 1000:.1f} ms, p90 {result['tpot_p90'] * 1000:.1f} ms; "
        f"{result['output_tokens']} output tokens in {result['wall_s']:.1f} s = "
        f"{result['tokens_per_s']:.1f} tok/s"
    )


def print_ratios(ours: dict[str, Any], theirs: dict[str, Any], label: str) -> None:
    print(
        f"{label} / llama-server: warm-turn TTFT p50 {theirs['warm_ttft_p50'] / ours['warm_ttft_p50']:.2f}x, "
        f"first turn {theirs['first_turn_ttft_p50'] / ours['first_turn_ttft_p50']:.2f}x, "
        f"inter-token p50 {theirs['itl_p50'] / ours['itl_p50']:.2f}x, "
        f"per output token p50 {theirs['tpot_p50'] / ours['tpot_p50']:.2f}x, "
        f"throughput {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--answer-tokens", type=int, default=48)
    parser.add_argument("--stagger", type=float, default=0.5, help="seconds between clients' starts")
    parser.add_argument(
        "--think", type=float, default=0.5, help="seconds between an answer and the next turn"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--gguf", help="GGUF file (default: the installed SmolLM2)")
    parser.add_argument("--only", choices=["ours", "llama"], help="run one server")
    parser.add_argument("--ws", action="store_true", help="also run our chat websocket")
    parser.add_argument(
        "--wait-policy",
        choices=["default", "active", "passive"],
        default="default",
        help="how idle kernel threads wait (OMP_WAIT_POLICY; llama-server's --poll 50 or 0); "
        "default: each server's own (ours: ENGINE_OMP_WAIT_POLICY, a short spin unless set; "
        "llama-server: --poll 50). On a shared machine spinning threads stall each other",
    )
    parser.add_argument("--json", default="", help="write the figures here")
    args = parser.parse_args(argv)
    load = Workload(
        clients=args.clients,
        turns=args.turns,
        answer_tokens=args.answer_tokens,
        stagger_s=args.stagger,
        think_s=args.think,
    )
    from inference.runner.model_files import default_model_path

    gguf = str(Path(args.gguf) if args.gguf else default_model_path())
    work = Path(tempfile.mkdtemp(prefix="bench-multiturn-"))
    print(f"{Path(gguf).name}: {load.clients} clients x {load.turns} turns, {args.threads} threads")
    results: dict[str, Any] = {}
    loads: dict[str, str] = {}
    if args.only != "llama":
        loads["ours"] = load_average()
        ours = run_ours(load, args.threads, args.ws, work, args.wait_policy)
        results.update(ours)
        loads.setdefault("ours (websocket)", ours.get("ours", {}).get("load_after", ""))
    if args.only != "ours":
        loads["llama-server"] = load_average()
        results["llama-server"] = run_llama_server(
            args.llama_server, gguf, load, args.threads, work, args.wait_policy
        )
    for name, result in results.items():
        print_result(name, result, loads[name])
    if "llama-server" in results:
        for name in ("ours", "ours (websocket)"):
            if name in results:
                print_ratios(results[name], results["llama-server"], name)
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": vars(args), "results": results}, indent=2))
    return results


if __name__ == "__main__":
    main()
