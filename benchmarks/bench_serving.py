"""The serving path's CPU cost per streamed token, with a model that costs nothing.

One Daphne process (started here, on a free port, on a temporary SQLite database) serves a
zero-cost model (``benchmarks.serving_model.repeat_word_model`` through ``ENGINE_LOADER``:
every token predicts the same word). For N = 64, 256 and 1,024 concurrent streams of 256
tokens each, over SSE (``/v1/chat/completions`` with ``stream: true``) and over the chat
websocket (one conversation per stream), it reports:

- CPU µs per streamed token of the server process, split by thread: the event loop (the main
  thread, which runs Twisted's reactor and asyncio), the engine thread, and the rest (the
  database thread pool, the channel layer, ...), read from /proc/<pid>/task/<tid>/stat;
- tokens/s (wall clock, all streams);
- p50 and p99 delay from a token's sampling (the model's ``compute_logits`` in its step) to
  its write on the socket (Daphne handing the SSE body or the websocket frame to its
  transport, recorded in the server) and to its arrival in the client, on the same
  monotonic clock (the arrival also includes the client's own lag);
- the server's writes and the event loop's CPU per write (comparable between runs whose loop
  kept up and runs where it fell behind and wrote fewer, larger events);
- the engine's steps, and the time the server spent in garbage collections (and the longest).

The client runs in a process of its own (``benchmarks.serving_client``). On a shared machine
the CPU figures move with the machine's speed (2× within minutes has been seen) and the
wall-clock ones more: compare alternated runs of two commits, not runs hours apart.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_serving.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_cluster import setup_django, thread_cpu_s  # noqa: E402

TOKENS = 256
LOADER = "benchmarks.serving_model.repeat_word_model"


def server_env(trace_dir: Path, max_streams: int) -> dict[str, str]:
    return {
        "ENGINE_LOADER": LOADER,
        "BENCH_SERVING_TRACE": str(trace_dir),
        "ENGINE_MAX_NUM_SEQS": str(max_streams),
        "ENGINE_MAX_WAITING": str(8 * max_streams),
        "ENGINE_MAX_BATCHED_TOKENS": str(max(2048, 4 * max_streams)),
        "ENGINE_KV_CACHE_GB": "0.05",
        "OMP_NUM_THREADS": "1",
        "API_RATE_LIMIT_PER_MINUTE": "0",
        "MAX_LIVE_PER_USER": "1000000",
        "LOG_LEVEL": "WARNING",
        "TITLES_FROM_MODEL": "false",
    }


def launch(work: Path, env: dict[str, str]):
    """Daphne as the Procfile runs it (access log on), with a long websocket handshake
    timeout: 1,024 tabs connecting at once wait longer than its 5 s default."""
    from tests.live_site import METRICS_TOKEN, LiveSite, daphne_argv, database_env, free_port

    port = free_port()
    full_env = {**os.environ, **database_env(), "CLUSTER_PREFIX": f"bench-{uuid.uuid4().hex[:8]}"}
    full_env.update(METRICS_TOKEN=METRICS_TOKEN, ENGINE_PRELOAD="true", **env)
    full_env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    log_path = work / f"daphne-{port}.log"
    process = subprocess.Popen(
        daphne_argv(port, "--websocket_connect_timeout", "300"),
        cwd=ROOT,
        env=full_env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )
    return LiveSite(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)


class Client:
    def __init__(self) -> None:
        argv = [sys.executable, "-m", "benchmarks.serving_client"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the client process did not start")

    def run(self, job: dict[str, Any], on_open: Callable[[], None] | None = None) -> dict[str, Any]:
        """The job's result; with ``open_first``, ``on_open`` runs once every tab shows its
        thread, before any asks."""
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the client process failed (see its stderr above)")
            result = json.loads(line)
            if result.get("phase") != "open":
                return result
            if on_open is not None:
                on_open()
            self.process.stdin.write("go\n")
            self.process.stdin.flush()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def read_trace(trace_dir: Path) -> dict[str, Any]:
    """Ask the server for its step and first-token times (``serving_model``)."""
    out = trace_dir / "trace.json"
    out.unlink(missing_ok=True)
    (trace_dir / "dump-request").touch()
    deadline = time.monotonic() + 30
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the server wrote no trace")
        time.sleep(0.05)
    return json.loads(out.read_text())


def first_tokens(trace: dict[str, Any], key: str) -> dict[Any, float]:
    """When each request's first token was sampled, by the streams' ``key``: the request id
    (SSE), or the message id the chat's request ids (``chat-<message id>-…``) carry."""
    firsts = trace["first_tokens"]
    if key == "request_id":
        return firsts
    return {int(rid.split("-")[1]): t for rid, t in firsts.items() if rid.startswith("chat-")}


def token_delays(streams: list[dict[str, Any]], trace: dict[str, Any], key: str) -> tuple[list[float], int]:
    """Per token: arrival minus its step's sampling time. Token i of a request was sampled i-1
    steps after its first (every running request gets one token per step here); tokens
    where that cannot hold (arrival before sampling) are counted as violations."""
    steps, firsts = trace["steps"], first_tokens(trace, key)
    delays, violations = [], 0
    for stream in streams:
        first = firsts.get(stream[key])
        if first is None:
            violations += 1
            continue
        k = bisect.bisect_right(steps, first) - 1
        seen = 0
        for arrival, count in stream["arrivals"]:
            for i in range(seen, seen + count):
                if k + i >= len(steps) or steps[k + i] > arrival:
                    violations += 1
                    continue
                delays.append(arrival - steps[k + i])
            seen += count
    return delays, violations


def server_writes(streams: list[dict[str, Any]], trace: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """This run's streams as the server wrote them: (time written, tokens) per stream."""
    writes = trace.get("writes", {})
    out = []
    for stream in streams:
        ident = stream.get(key)
        found = writes.get(ident if key == "request_id" else f"ws:{ident}")
        if found:
            out.append({key: ident, "arrivals": found})
    return out


def steps_during(trace: dict[str, Any], streams: list[dict[str, Any]], key: str) -> int:
    """The engine's steps from this run's first sampled token to its last arrival: with a
    fixed number of tokens, fewer tokens per step means more per-step work per token."""
    firsts = first_tokens(trace, key)
    starts = [firsts[s[key]] for s in streams if s[key] in firsts]
    ends = [a for s in streams for a, _ in s["arrivals"]]
    if not starts or not ends:
        return 0
    steps = trace["steps"]
    return bisect.bisect_right(steps, max(ends)) - bisect.bisect_left(steps, min(starts))


def collections_during(trace: dict[str, Any], streams: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """Seconds the server spent in garbage collections (each one pauses all its threads)
    from this run's first sampled token to its last arrival, and the longest one."""
    firsts = first_tokens(trace, key)
    starts = [firsts[s[key]] for s in streams if s[key] in firsts]
    ends = [a for s in streams for a, _ in s["arrivals"]]
    if not starts or not ends:
        return 0.0, 0.0
    begin, end = min(starts), max(ends)
    pauses = [seconds for at, seconds, _ in trace.get("collections", []) if begin <= at <= end]
    return sum(pauses), max(pauses, default=0.0)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_conversations(count: int, tokens: int, temperature: float) -> list[tuple[int, str]]:
    """(conversation id, session cookie) per websocket stream: one user each, as a busy site
    has (one user's 256 tabs would turn each sidebar broadcast into 256 messages)."""
    from django.contrib.auth import get_user_model

    from conversations.models import Conversation
    from tests.conftest import session_cookie_for

    tag = uuid.uuid4().hex[:8]
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"bench-{tag}-{i}") for i in range(count)]
    )
    made = Conversation.objects.bulk_create(
        [Conversation(owner=u, max_tokens=tokens, temperature=temperature, top_p=1.0) for u in users]
    )
    return [(c.pk, session_cookie_for(u).decode()) for c, u in zip(made, users, strict=True)]


def run_one(
    site, client: Client, job: dict[str, Any], trace_dir: Path, engine_tid: int | None, raw: str = ""
) -> dict:
    """One job's figures. Websocket tabs connect and show their threads first (``open_first``):
    the CPU per token counts from when every tab is open, as a chat's questions come to open
    tabs; the connects' CPU is reported apart, per tab, and in ``us_per_token_with_connect``."""
    pid = site.process.pid
    connected: dict[int, float] = {}
    before = thread_cpu_s(pid)
    result = client.run(job, on_open=lambda: connected.update(thread_cpu_s(pid)))
    after = thread_cpu_s(pid)
    opened = connected or before
    connect_s = sum(opened.values()) - sum(before.get(tid, 0.0) for tid in opened)
    before = opened
    trace = read_trace(trace_dir)
    if raw:
        Path(raw).mkdir(parents=True, exist_ok=True)
        out = Path(raw) / f"{job['transport']}-{job['streams']}.json"
        out.write_text(json.dumps({"streams": result["streams"], "trace": trace}))
    engine_tid = engine_tid or trace["threads"].get("engine")
    spent = {tid: t - before.get(tid, 0.0) for tid, t in after.items()}
    loop_s = spent.pop(pid, 0.0)
    engine_s = spent.pop(engine_tid, 0.0)
    other_s = sum(spent.values())
    names = {int(tid): name for tid, name in trace.get("thread_names", {}).items()}
    other_by_thread: dict[str, float] = {}
    for tid, seconds in spent.items():
        name = re.sub(r"_\d+$", "", names.get(tid, "exited"))  # pools' workers together
        other_by_thread[name] = other_by_thread.get(name, 0.0) + seconds
    streams = result["streams"]
    tokens = sum(c for s in streams for _, c in s["arrivals"])
    expected = job["streams"] * job["tokens"]
    key = "request_id" if job["transport"] == "sse" else "message_id"
    delays, violations = token_delays(streams, trace, key)
    written = server_writes(streams, trace, key)
    num_writes = sum(len(s["arrivals"]) for s in written)
    writes, _ = token_delays(written, trace, key)
    us = 1e6 / max(tokens, 1)
    steps = steps_during(trace, streams, key)
    gc_s, gc_max_s = collections_during(trace, streams, key)
    return {
        "transport": job["transport"],
        "streams": job["streams"],
        "tokens": tokens,
        "tokens_expected": expected,
        "us_per_token": (loop_s + engine_s + other_s) * us,
        "us_per_token_loop": loop_s * us,
        "us_per_token_engine": engine_s * us,
        "us_per_token_other": other_s * us,
        "us_per_token_other_by_thread": {
            name: seconds * us for name, seconds in sorted(other_by_thread.items(), key=lambda kv: -kv[1])
        },
        "connect_ms_per_tab": connect_s * 1000 / job["streams"] if connected else None,
        "us_per_token_with_connect": (loop_s + engine_s + other_s + connect_s) * us,
        "tokens_per_s": tokens / result["wall_s"],
        "wall_s": result["wall_s"],
        "write_p50_ms": percentile(writes, 0.5) * 1000,
        "write_p99_ms": percentile(writes, 0.99) * 1000,
        "delay_p50_ms": percentile(delays, 0.5) * 1000,
        "delay_p99_ms": percentile(delays, 0.99) * 1000,
        "delay_violations": violations,
        "events": sum(len(s["arrivals"]) for s in streams),
        # The loop's CPU per write: comparable between runs that write more or fewer tokens at a
        # time (a loop that falls behind writes fewer, larger events and spends less per token).
        "server_writes": num_writes,
        "loop_us_per_write": loop_s * 1e6 / max(1, num_writes),
        "steps": steps,
        "tokens_per_step": tokens / max(steps, 1),
        "gc_ms": gc_s * 1000,
        "gc_max_ms": gc_max_s * 1000,
    }


def other_threads(row: dict[str, Any], top: int = 3) -> str:
    """The threads behind "other", the largest first (a pool's workers under one name)."""
    shares = list(row["us_per_token_other_by_thread"].items())[:top]
    return ", ".join(f"{name} {us:.1f}" for name, us in shares)


def print_row(row: dict[str, Any]) -> None:
    print(
        f"  {row['transport']:>3} N={row['streams']:>5}: {row['us_per_token']:7.1f} µs/token "
        f"(loop {row['us_per_token_loop']:6.1f}, engine {row['us_per_token_engine']:6.1f}, "
        f"other {row['us_per_token_other']:5.1f}: {other_threads(row)}); {row['tokens_per_s']:8.0f} tok/s; "
        f"sampling->socket write p50 {row['write_p50_ms']:5.1f} ms, p99 {row['write_p99_ms']:6.1f} ms; "
        f"->client p50 {row['delay_p50_ms']:6.1f} ms, p99 {row['delay_p99_ms']:6.1f} ms; "
        f"{row['tokens']}/{row['tokens_expected']} tokens in {row['events']} events "
        f"({row['server_writes']} writes, loop {row['loop_us_per_write']:.0f} µs each), "
        f"{row['steps']} steps ({row['tokens_per_step']:.0f} tokens each); "
        f"gc {row['gc_ms']:.0f} ms (longest {row['gc_max_ms']:.0f})"
        + (f"; {row['delay_violations']} untimed" if row["delay_violations"] else "")
        + (
            f"; connects {row['connect_ms_per_tab']:.2f} ms per tab "
            f"({row['us_per_token_with_connect']:.1f} µs/token with them)"
            if row["connect_ms_per_tab"] is not None
            else ""
        ),
        flush=True,
    )


def profiler(directory: str, pid: int, name: str, rate: int = 250) -> subprocess.Popen | None:
    """py-spy sampling every thread of the server (native frames too) into collapsed stacks."""
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    out = Path(directory) / f"{name}.txt"
    argv = [
        str(spy),
        "record",
        "-p",
        str(pid),
        "-r",
        str(rate),
        "-f",
        "raw",
        "--threads",
        "--gil",
        "-o",
        str(out),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the run starts
    return process


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description="CPU per streamed token of the serving path")
    parser.add_argument("--quick", action="store_true", help="N = 256 only (about a minute)")
    parser.add_argument("--streams", default="", help="comma-separated N (default 64,256,1024)")
    parser.add_argument("--transports", default="sse,ws")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="default greedy: drawing a row's sampling noise on the CPU is model work (one kernel on a GPU)",
    )
    parser.add_argument(
        "--connect-while-asking",
        action="store_true",
        help="websocket tabs ask as soon as each is open (their connects then count in the per-token CPU)",
    )
    parser.add_argument("--json", default="", help="write the rows here")
    parser.add_argument("--profile", default="", help="py-spy each run into this directory (slows it)")
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--raw", default="", help="write each run's arrivals and server trace here")
    args = parser.parse_args(argv)
    counts = [int(n) for n in (args.streams or ("256" if args.quick else "64,256,1024")).split(",")]
    transports = args.transports.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    setup_django(work / "db.sqlite3")
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.live_site import stop_live_site, wait_until_ready

    user = get_user_model().objects.create_user(f"bench-{uuid.uuid4().hex[:8]}", password="a-long-pass-42")
    _, key = ApiKey.objects.create_key(user, "bench")
    trace_dir = work / "trace"
    trace_dir.mkdir()
    env = server_env(trace_dir, max(counts))
    site = wait_until_ready(launch(work, env))
    host, port = "127.0.0.1", int(site.url.rsplit(":", 1)[1])
    print(f"server pid {site.process.pid} at {site.url}", flush=True)
    client = Client()
    rows: list[dict] = []
    try:
        base = {"host": host, "port": port, "key": key, "model": "repeat-word"}
        base["temperature"] = args.temperature
        for transport in transports:  # warm-up: imports, first connections
            warm = make_conversations(8, 8, args.temperature) if transport == "ws" else []
            client.run({**base, "transport": transport, "streams": 8, "tokens": 8, "conversations": warm})
        for n in counts:
            for transport in transports:
                conversations = (
                    make_conversations(n, args.tokens, args.temperature) if transport == "ws" else []
                )
                job = {**base, "transport": transport, "streams": n, "tokens": args.tokens}
                job["open_first"] = transport == "ws" and not args.connect_while_asking
                spy = profiler(args.profile, site.process.pid, f"{transport}-{n}", args.profile_rate)
                row = run_one(
                    site, client, {**job, "conversations": conversations}, trace_dir, None, args.raw
                )
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait()
                rows.append(row)
                print_row(row)
    finally:
        client.close()
        stop_live_site(site)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
