"""Benchmarks of the multi-process site, as ratios measured in one run.

1. Affinity (needs DATABASE_URL and REDIS_URL): two Daphne processes A and B. For each
   round, a conversation with a long history gets turn 1 from a tab on A, then
   - *same process*: turn 2 from a tab on A (A's engine, its history's KV blocks warm);
   - *affinity hit*: turn 3 from a tab on B, forwarded to A and relayed back to B;
   - *cold miss*: the same history copied into a new conversation, its next turn from a
     tab on B, which prefills it all (B's engine never saw it).
   Time to first token is measured in the tab: from sending to the first ``delta``.
2. The web layer: 16 concurrent streaming chat completions through ``/v1`` with the
   official ``openai`` client against one process, versus the offline engine
   (``inference.LLM``) on the same 16 requests in this process, run alternately. The
   client runs in a process of its own, once at normal priority and once at nice 19
   (standing in for a remote client, whose parsing costs the server nothing); each
   round prints the CPU seconds of the client, of the server's event loop thread and
   of its other threads (the engine and its compute threads).

    DATABASE_URL=postgresql://... REDIS_URL=redis://... \\
        PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cluster.py [--model PATH] [--rounds 3]

Without DATABASE_URL/REDIS_URL only part 2 runs (on a temporary SQLite database).
The figures are noisy on a shared machine; compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def setup_django(db_path: Path | None) -> None:
    if db_path is not None:
        os.environ["SQLITE_PATH"] = str(db_path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # this script's ORM calls are set-up only
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def start_sites(count: int, model: str, env: dict[str, str]) -> list:
    from tests.live_site import launch_live_site, wait_until_ready

    log_dir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    sites = [launch_live_site(Path(model), log_dir, **env) for _ in range(count)]
    for site in sites:
        wait_until_ready(site)
    return sites


# --- Part 1: time to first token -----------------------------------------------------


async def tab(site, cookie: str, conversation_id: int):
    import websockets

    ws = await websockets.connect(
        site.url.replace("http://", "ws://") + "/ws/chat/",
        additional_headers={"Cookie": cookie, "Origin": "http://127.0.0.1"},
        max_size=None,
    )
    await ws.send(json.dumps({"type": "open", "conversation_id": conversation_id}))
    while json.loads(await ws.recv())["type"] != "thread":
        pass
    return ws


async def turn(ws, text: str) -> float:
    """Send ``text``; seconds to the answer's first delta (the answer is awaited)."""
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "send", "content": text}))
    answer_id, first = None, None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 300))
        if event["type"] == "error":
            raise RuntimeError(event)
        if event["type"] == "thread" and answer_id is None:
            last = event["messages"][-1]
            if last["role"] == "assistant" and last["status"] == "streaming":
                answer_id = last["id"]
        elif event["type"] == "delta" and event["message_id"] == answer_id and first is None:
            first = time.perf_counter() - start
        elif event["type"] == "finished" and event["message"]["id"] == answer_id:
            return first if first is not None else time.perf_counter() - start


def make_history(user, words: int, seed: int):
    import random

    from conversations.models import Conversation, Message

    rng = random.Random(seed)
    vocab = "river stone market letter garden window silver engine orange paper bridge winter".split()
    conversation = Conversation.objects.create(owner=user, temperature=0.0, max_tokens=8)
    parent = None
    for i in range(6):
        text = " ".join(rng.choice(vocab) for _ in range(words // 12))
        parent = Message.objects.create(
            conversation=conversation, parent=parent, role="user", content=f"{i}: {text}"
        )
        text = " ".join(rng.choice(vocab) for _ in range(words // 12))
        parent = Message.objects.create(
            conversation=conversation, parent=parent, role="assistant", content=text
        )
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=parent)
    return conversation


def copy_thread(user, conversation):
    from conversations.chat.tree import Tree
    from conversations.models import Conversation, Message

    copy = Conversation.objects.create(owner=user, temperature=0.0, max_tokens=8)
    parent = None
    for message in Tree.load(conversation).thread():
        parent = Message.objects.create(
            conversation=copy, parent=parent, role=message.role, content=message.content
        )
    Conversation.objects.filter(pk=copy.pk).update(current_leaf=parent)
    return copy


async def bench_affinity(a, b, user, cookie: str, rounds: int, words: int) -> dict:
    from asgiref.sync import sync_to_async

    same, hit, cold = [], [], []

    async def fresh_turn(site, conversation_id: int, text: str) -> float:
        # A fresh tab per turn: an older tab would still hold the previous turns' events.
        ws = await tab(site, cookie, conversation_id)
        try:
            return await turn(ws, text)
        finally:
            await ws.close()

    for r in range(rounds):
        conversation = await sync_to_async(make_history)(user, words, seed=r)
        await fresh_turn(a, conversation.pk, "Turn one: summarise the above.")  # warms A's cache
        same.append(await fresh_turn(a, conversation.pk, "Turn two: and then?"))
        hit.append(await fresh_turn(b, conversation.pk, "Turn three: and after that?"))
        copy = await sync_to_async(copy_thread)(user, conversation)
        cold.append(await fresh_turn(b, copy.pk, "Turn three: and after that?"))
        print(
            f"  round {r}: same {same[-1] * 1000:.0f} ms, hit {hit[-1] * 1000:.0f} ms, cold {cold[-1] * 1000:.0f} ms"
        )
    m_same, m_hit, m_cold = (statistics.median(x) for x in (same, hit, cold))
    return {
        "ttft_same_process_ms": m_same * 1000,
        "ttft_affinity_hit_ms": m_hit * 1000,
        "ttft_cold_miss_ms": m_cold * 1000,
        "hit_over_same": m_hit / m_same,
        "cold_over_same": m_cold / m_same,
        "cold_over_hit": m_cold / m_hit,
    }


# --- Part 2: the web layer's cost ----------------------------------------------------

PROMPTS = [
    f"Request {i}: write a long story about a {w} and its travels."
    for i, w in enumerate(
        "fox owl bear cat dog horse crow whale ant bee frog lion wolf deer hare mole".split()
    )
]


def offline_run(llm, max_tokens: int) -> float:
    from inference import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


async def api_run(site, key: str, model: str, max_tokens: int) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{site.url}/v1", api_key=key, max_retries=0, timeout=600)

    async def one(prompt: str) -> int:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        tokens = 0
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens

    start = time.perf_counter()
    tokens = await asyncio.gather(*(one(p) for p in PROMPTS))
    elapsed = time.perf_counter() - start
    await client.close()
    assert all(t == max_tokens for t in tokens), tokens
    return sum(tokens) / elapsed


def serve_client(url: str, key: str, model: str, max_tokens: int, nice: int) -> None:
    """Child mode: one ``api_run`` per line on stdin, its result as one JSON line."""
    import types

    os.nice(nice)
    site = types.SimpleNamespace(url=url)
    asyncio.run(api_run(site, key, model, 8))  # imports and the first connections
    print("ready", flush=True)
    for _ in sys.stdin:
        cpu = time.process_time()
        tokens_per_s = asyncio.run(api_run(site, key, model, max_tokens))
        print(json.dumps({"tokens_per_s": tokens_per_s, "cpu_s": time.process_time() - cpu}), flush=True)


class ClientProcess:
    """The official client in its own process, so that its CPU time is measured apart and
    its priority can be lowered (a remote user's client costs the server nothing)."""

    def __init__(self, site, key: str, model: str, max_tokens: int, nice: int) -> None:
        import subprocess

        argv = [sys.executable, __file__, "--client", site.url, key, model, str(max_tokens), str(nice)]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the client process did not start")

    def run(self) -> dict:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def server_cpu_split(pid: int, before: dict[int, float]) -> tuple[float, float]:
    """(event loop thread, all other threads) CPU seconds since ``before``."""
    after = thread_cpu_s(pid)
    spent = {tid: t - before.get(tid, 0.0) for tid, t in after.items()}
    loop = spent.pop(pid, 0.0)  # the main thread runs Daphne's reactor and the asyncio loop
    return loop, sum(spent.values())


def bench_web_layer(site, key: str, model_arg: str, max_tokens: int, rounds: int) -> dict:
    """Per round: the offline engine, then /v1 with the client at normal priority, then
    /v1 with the client at nice 19. Medians over the rounds."""
    from inference import LLM
    from tests.live_site import health_details

    model = health_details(site.url)["engine"]["model"]
    llm = LLM(model_arg)
    offline_run(llm, 8)
    clients = {
        "normal": ClientProcess(site, key, model, max_tokens, nice=0),
        "nice19": ClientProcess(site, key, model, max_tokens, nice=19),
    }
    rows: list[dict] = []
    try:
        for r in range(rounds):
            row = {"offline": offline_run(llm, max_tokens)}
            for name, client in clients.items():
                before = thread_cpu_s(site.process.pid)
                result = client.run()
                loop_s, engine_s = server_cpu_split(site.process.pid, before)
                row[name] = result["tokens_per_s"]
                row[f"{name}_client_cpu_s"] = result["cpu_s"]
                row[f"{name}_server_loop_cpu_s"] = loop_s
                row[f"{name}_server_other_cpu_s"] = engine_s
            rows.append(row)
            print(
                f"  round {r}: offline {row['offline']:.1f} tok/s; /v1 {row['normal']:.1f} tok/s "
                f"({row['normal'] / row['offline']:.2f}x; client CPU {row['normal_client_cpu_s']:.2f} s, "
                f"server event loop {row['normal_server_loop_cpu_s']:.2f} s, engine threads "
                f"{row['normal_server_other_cpu_s']:.2f} s); client at nice 19 {row['nice19']:.1f} tok/s "
                f"({row['nice19'] / row['offline']:.2f}x)"
            )
    finally:
        for client in clients.values():
            client.close()
    del llm

    def median(name: str) -> float:
        return statistics.median(row[name] for row in rows)

    return {
        "offline_tokens_per_s": median("offline"),
        "api_tokens_per_s": median("normal"),
        "api_over_offline": statistics.median(row["normal"] / row["offline"] for row in rows),
        "api_client_nice19_over_offline": statistics.median(row["nice19"] / row["offline"] for row in rows),
        "client_cpu_s": median("normal_client_cpu_s"),
        "server_event_loop_cpu_s": median("normal_server_loop_cpu_s"),
        "server_engine_threads_cpu_s": median("normal_server_other_cpu_s"),
    }


def main(argv: list[str] | None = None) -> dict:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--client":
        url, key, model, max_tokens, nice = sys.argv[2:7]
        serve_client(url, key, model, int(max_tokens), int(nice))
        return {}
    parser = argparse.ArgumentParser(description="TTFT with affinity, and the web layer's cost")
    parser.add_argument("--model", default="", help="model path (default: the site's default model)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history-words", type=int, default=900)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per API completion")
    parser.add_argument("--skip-affinity", action="store_true")
    parser.add_argument("--skip-web", action="store_true")
    args = parser.parse_args(argv)
    cluster = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    db = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp()) / "bench.sqlite3"
    setup_django(db)
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.conftest import session_cookie_for
    from tests.live_site import stop_live_site

    user = get_user_model().objects.create_user(
        f"bench-{uuid.uuid4().hex[:8]}", password="a-long-unusual-pass-42"
    )
    cookie = session_cookie_for(user).decode()
    _, key = ApiKey.objects.create_key(user, "bench")
    from inference.runner.model_files import default_model_path

    args.model = args.model or str(default_model_path())
    env = {"CLUSTER_PREFIX": f"bench-{uuid.uuid4().hex[:8]}"}
    sites = start_sites(2 if cluster and not args.skip_affinity else 1, args.model, env)
    results: dict = {}
    try:
        if cluster and not args.skip_affinity:
            time.sleep(3)  # both advertised
            print("affinity (time to first token, medians):")
            results["affinity"] = asyncio.run(
                bench_affinity(*sites, user, cookie, args.rounds, args.history_words)
            )
        elif not args.skip_affinity:
            print("affinity: skipped (needs DATABASE_URL and REDIS_URL)")
        if not args.skip_web:
            print("web layer (16 concurrent streaming chat completions):")
            results["web"] = bench_web_layer(sites[0], key, args.model, args.max_tokens, args.rounds)
    finally:
        for site in sites:
            stop_live_site(site)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
