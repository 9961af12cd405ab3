"""Prompt lookup decoding, ours against llama.cpp's, on the same GGUF and prompts.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_spec_llamacpp.py [--tokens N] [--k K]
        [--repeats R] [--threads T] [--node NODE] [--node-modules DIR] [--json FILE]

For each workload of ``bench_spec`` (a code edit, a text rewrite, an open chat), one greedy
answer of ``--tokens`` tokens from the same prompt token ids (our tokenizer's chat
template), with and without prompt lookup:

- ours: ``bench_spec``'s two engines (no speculation, ``ngram`` with k proposals);
- llama.cpp through node-llama-cpp's prebuilt CPU binaries (``llamacpp_node_runner.mjs``;
  install as ``bench_vs_llamacpp.py`` says), plain and with its ``InputLookupTokenPredictor``
  proposing up to k tokens (pattern of at least one token, its default).

Each side alternates off and on ``--repeats`` times and keeps its best decode rate (the
first token, which comes with the prefill, is not counted). Both use the same thread
count. Reported: tokens/s, the speedup of lookup on each side, the share of proposed tokens
accepted, and whether lookup changed the greedy tokens (it must not, on either side).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_spec import compare, make_engine
from benchmarks.bench_spec_workloads import WORKLOADS
from benchmarks.bench_vs_llamacpp import DEFAULT_NODE_MODULES, NODE_RUNNER


def run_llama(args: argparse.Namespace, gguf: str, prompt: list[int], lookup: bool) -> dict[str, Any]:
    job: dict[str, Any] = {"gguf": gguf, "prompts": [prompt], "tokens": args.tokens, "threads": args.threads}
    if lookup:
        job["lookup"] = {"pattern_min": 1, "pattern_max": 0, "predict_max": args.k}
    env = dict(os.environ, NODE_PATH=args.node_modules, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
    done = subprocess.run(
        [args.node, str(NODE_RUNNER)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp runner failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_pair(args: argparse.Namespace, gguf: str, prompt: list[int]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeats):
        for name, lookup in (("off", False), ("lookup", True)):
            run = run_llama(args, gguf, prompt, lookup)
            if name not in best or run["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = run
    off, on = best["off"], best["lookup"]
    counts = on.get("predictions") or {}
    checked = counts.get("validated", 0) + counts.get("refuted", 0)
    return {
        "off_tok_s": off["tokens_per_s"],
        "lookup_tok_s": on["tokens_per_s"],
        "speedup": on["tokens_per_s"] / off["tokens_per_s"],
        "acceptance": counts.get("validated", 0) / checked if checked else 0.0,
        "identical": off["outputs"] == on["outputs"],
        "predictions": counts,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=5, help="proposed tokens per step, both sides")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="threads for both (default: torch's)")
    parser.add_argument("--node", default="node")
    parser.add_argument("--node-modules", default=os.environ.get("NODE_PATH") or DEFAULT_NODE_MODULES)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()

    from inference.runner.model_files import default_model_path
    from inference.runner.model_loader import load_model

    gguf = str(default_model_path())
    loaded = load_model(None, device="cpu")
    engines = {"off": make_engine(loaded, None, args.k), "ngram": make_engine(loaded, "ngram", args.k)}
    print(
        f"{Path(gguf).name}, {args.tokens} greedy tokens, k={args.k}, {args.threads} threads,"
        f" load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    figures: dict[str, Any] = {"tokens": args.tokens, "k": args.k, "threads": args.threads, "workloads": {}}
    for name, text in WORKLOADS.items():
        prompt = loaded[1].encode_chat([{"role": "user", "content": text}])
        runs = compare(engines, [prompt], args.tokens, args.repeats)
        ours = {
            "off_tok_s": runs["off"]["tok_s"],
            "lookup_tok_s": runs["ngram"]["tok_s"],
            "speedup": runs["ngram"]["speedup"],
            "acceptance": runs["ngram"]["acceptance"],
            "identical": runs["ngram"]["identical"],
        }
        llama = llama_pair(args, gguf, prompt)
        figures["workloads"][name] = {"prompt_tokens": len(prompt), "ours": ours, "llama_cpp": llama}
        for side, row in (("ours", ours), ("llama.cpp", llama)):
            print(
                f"{name:13s} {side:9s} off {row['off_tok_s']:6.1f} tok/s, lookup {row['lookup_tok_s']:6.1f} tok/s"
                f" = {row['speedup']:.2f}x, accepted {row['acceptance']:.0%}, identical {row['identical']}",
                flush=True,
            )
    figures["load_average"] = os.getloadavg()[0]
    print(f"1-minute load average at the end: {figures['load_average']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
