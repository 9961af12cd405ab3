"""guidellm (vLLM's benchmark tool) against the site, unmodified, with its defaults.

One Daphne process on a temporary SQLite database serves the default model (or, with
``--zero-cost``, ``bench_serving``'s scripted one); guidellm runs from its own virtualenv
(``--guidellm``, default ``/tmp/guidellm-venv/bin/guidellm``: it pins its own torch and
transformers, so it must not share the site's) with synthetic 256-token prompts and
128-token answers at 1, 4, 16 and 64 concurrent streams, and this script prints its TTFT
and ITL per concurrency from guidellm's JSON report.

    python -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install guidellm
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_guidellm.py [--zero-cost] [--requests 1,4,16,64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_cluster import setup_django  # noqa: E402
from benchmarks.bench_serving import LOADER, launch  # noqa: E402


def guidellm_argv(
    args: argparse.Namespace, url: str, key: str, model: str, tokenizer: Path, out: Path
) -> list:
    return [
        args.guidellm,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={model},api_key={key}",
        "--profile",
        "kind=concurrent,streams=1",
        "--override",
        "profile.streams",
        args.streams,
        "--data",
        f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--constraint",
        json.dumps({"kind": "max_requests", "count": [int(n) for n in args.requests.split(",")]}),
        "--output",
        f"kind=json,path={out}",
        "--disable-progress",
    ]


def summarise(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per benchmark (one concurrency): its streams, requests, TTFT and ITL (ms), output tok/s."""
    rows = []
    for bench in report.get("benchmarks", []):
        metrics = bench["metrics"]

        def stat(name: str, key: str, metrics: dict = metrics) -> float | None:
            values = metrics.get(name, {}).get("successful", {})
            return values.get(key)

        strategy = bench.get("config", {}).get("strategy", {})
        rows.append(
            {
                "streams": strategy.get("streams"),
                "requests": metrics.get("request_totals", {}).get("successful"),
                "ttft_ms_median": stat("time_to_first_token_ms", "median"),
                "ttft_ms_p99": (stat("time_to_first_token_ms", "percentiles") or {}).get("p99"),
                "itl_ms_median": stat("inter_token_latency_ms", "median"),
                "itl_ms_p99": (stat("inter_token_latency_ms", "percentiles") or {}).get("p99"),
                "output_tokens_per_s": stat("output_tokens_per_second", "mean"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description="guidellm against one site process")
    parser.add_argument("--guidellm", default="/tmp/guidellm-venv/bin/guidellm")
    parser.add_argument("--zero-cost", action="store_true", help="serve bench_serving's scripted model")
    parser.add_argument("--streams", default="1,4,16,64")
    parser.add_argument("--requests", default="4,8,16,64", help="requests per concurrency")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--json", default="", help="write the summary rows here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-guidellm-"))
    setup_django(work / "db.sqlite3")
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.live_site import health_details, stop_live_site, wait_until_ready
    from tests.support.fakes import smollm2_tokenizer_dir

    user = get_user_model().objects.create_user(f"guidellm-{uuid.uuid4().hex[:8]}", password="a-long-pass-42")
    _, key = ApiKey.objects.create_key(user, "guidellm")
    env = {"API_RATE_LIMIT_PER_MINUTE": "0", "ENGINE_MAX_WAITING": "1024", "LOG_LEVEL": "WARNING"}
    if args.zero_cost:
        trace = work / "trace"
        trace.mkdir()
        env.update(ENGINE_LOADER=LOADER, BENCH_SERVING_TRACE=str(trace), ENGINE_KV_CACHE_GB="0.05")
    site = wait_until_ready(launch(work, env))
    out = work / "guidellm.json"
    try:
        model = health_details(site.url)["engine"]["model"]
        argv_ = guidellm_argv(args, site.url, key, model, smollm2_tokenizer_dir(), out)
        print(" ".join(a if "api_key" not in a else a.split("api_key")[0] + "api_key=…" for a in argv_))
        done = subprocess.run(argv_, cwd=work, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
            raise RuntimeError(f"guidellm exited with {done.returncode}")
    finally:
        stop_live_site(site)
    rows = summarise(json.loads(out.read_text()))
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
