"""Speculative decoding on one stream: tokens/s with and without n-gram speculation
(prompt lookup), its acceptance rate, and greedy outputs checked identical.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_spec.py [--quick] [--model PATH]
        [--tokens N] [--k K] [--repeats R] [--crossover] [--draft PATH] [--json FILE]
        [--threads T] [--cpu-time]

The default model is SmolLM2-135M-Instruct (the installed GGUF, as ``make bench`` loads
it). Each workload (``bench_spec_workloads``: a code edit, a text rewrite, an open chat)
runs greedy, one request at a time, on two engines over one copy of the weights, one
without speculation and one with it, alternating ``--repeats`` times; the best decode
rate of each counts (the first token, which comes with the prompt's prefill, is not
counted). ``--crossover`` also runs B copies of the code edit at once for growing B,
speculation forced on at every batch size, to show where it stops paying (the engine's
``speculative_max_batch``). ``--draft PATH`` adds a row with a draft model proposing.
``--cpu-time`` times the decode by the process's CPU time instead of the wall clock: with
``--threads 1`` on a shared machine, time spent waiting for a core then does not count.

llama.cpp's own prompt lookup on the same GGUF and prompts: ``bench_spec_llamacpp.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

from benchmarks.bench_spec_workloads import WORKLOADS
from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="HF directory or GGUF (default: SmolLM2-135M)")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (about a minute)")
    parser.add_argument("--tokens", type=int, default=None, help="greedy tokens per answer (256; quick 160)")
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--repeats", type=int, default=None, help="alternating runs per engine (3; quick 1)")
    parser.add_argument("--crossover", action="store_true", help="also measure batch sizes 1..16")
    parser.add_argument("--draft", default=None, help="a draft model path: adds a draft-model row")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--cpu-time", action="store_true", help="time decoding by process CPU time")
    args = parser.parse_args(argv)
    args.tokens = args.tokens or (160 if args.quick else 256)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def make_engine(loaded: Any, speculative: str | None, k: int, max_batch: int | None = None) -> LLMEngine:
    config = EngineConfig(kv_cache_gb=0.25, speculative=speculative, num_speculative_tokens=k)
    if max_batch is not None:
        config.speculative_max_batch = max_batch
    return LLMEngine(config, loaded=loaded)


CLOCK = time.perf_counter  # time.process_time with --cpu-time


def decode_run(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """Run ``prompts`` together (greedy); decode tokens/s after the step that prefilled
    them, and the outputs."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    engine.block_manager.reset_prefix_cache()
    before = engine.speculator.stats.__dict__.copy()
    requests = [engine.add_request(p, params) for p in prompts]
    while any(r.seqs and r.seqs[0].num_output_tokens == 0 for r in requests):
        engine.step()  # the prefill and first tokens
    first = sum(len(engine.request_output(r).outputs[0].token_ids) for r in requests)
    start = CLOCK()
    while engine.has_unfinished():
        engine.step()
    seconds = CLOCK() - start
    outputs = [engine.request_output(r).outputs[0].token_ids for r in requests]
    decoded = sum(len(o) for o in outputs) - first
    after = engine.speculator.stats.__dict__
    proposed = after["proposed_tokens"] - before["proposed_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    return {
        "tok_s": decoded / seconds if seconds else 0.0,
        "tokens": decoded,
        "outputs": outputs,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": accepted / proposed if proposed else 0.0,
        "verify_steps": after["verify_steps"] - before["verify_steps"],
    }


def compare(engines: dict[str, LLMEngine], prompts: list[list[int]], tokens: int, repeats: int) -> dict:
    """Each engine runs ``prompts`` ``repeats`` times, alternating; the best rate counts."""
    best: dict[str, dict[str, Any]] = {}
    for _ in range(repeats):
        for name, engine in engines.items():
            run = decode_run(engine, prompts, tokens)
            if name not in best or run["tok_s"] > best[name]["tok_s"]:
                best[name] = run
    base = best["off"]
    for run in best.values():
        run["speedup"] = run["tok_s"] / base["tok_s"]
        run["identical"] = run["outputs"] == base["outputs"]
    return best


def single_stream(args: argparse.Namespace, loaded: Any, engines: dict[str, LLMEngine]) -> dict:
    tokenizer = loaded[1]
    results = {}
    for name, text in WORKLOADS.items():
        prompt = tokenizer.encode_chat([{"role": "user", "content": text}])
        runs = compare(engines, [prompt], args.tokens, args.repeats)
        results[name] = runs
        line = f"{name:13s} prompt {len(prompt):4d} tok | off {runs['off']['tok_s']:6.1f} tok/s"
        for mode, run in runs.items():
            if mode != "off":
                line += (
                    f" | {mode} {run['tok_s']:6.1f} tok/s = {run['speedup']:.2f}x,"
                    f" accepted {run['accepted']}/{run['proposed']} ({run['acceptance']:.0%}),"
                    f" identical {run['identical']}"
                )
        print(line, flush=True)
    return results


def verify_cost(loaded: Any, repeats: int = 5) -> dict[int, float]:
    """Time of one step verifying L proposed tokens of one 300-token sequence, over a plain
    decode step (L = 0); the best of ``repeats``, L interleaved."""
    from inference.engine.scheduler import ScheduledBatch
    from inference.spec.verify import expand

    engine = make_engine(loaded, None, 8)
    request = engine.add_request(list(range(1000, 1300)), SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    seq = request.seqs[0]
    assert engine.block_manager.allocate_slots(seq, 17)
    best: dict[int, float] = {}
    for _ in range(repeats):
        for extra in (0, 1, 2, 3, 4, 5, 6, 8, 16):
            batch = ScheduledBatch(seqs=[seq], num_new_tokens=[1])
            run = expand(batch, {0: [5] * extra}).run if extra else batch
            start = time.perf_counter()
            engine.runner.execute(run)
            best[extra] = min(best.get(extra, 1e9), time.perf_counter() - start)
    ratios = {extra: t / best[0] for extra, t in best.items()}
    print(
        "verify step / decode step, by proposed tokens: "
        + ", ".join(f"{extra}: {r:.2f}x" for extra, r in ratios.items())
        + f" (decode step {best[0] * 1000:.1f} ms)",
        flush=True,
    )
    return ratios


def crossover(args: argparse.Namespace, loaded: Any) -> dict[int, dict[str, float]]:
    """Throughput of B copies of the code edit at once, speculation on at every B / off."""
    tokenizer = loaded[1]
    prompt = tokenizer.encode_chat([{"role": "user", "content": WORKLOADS["code edit"]}])
    engines = {
        "off": make_engine(loaded, None, args.k),
        "ngram": make_engine(loaded, "ngram", args.k, 10_000),
    }
    tokens = min(args.tokens, 96 if args.quick else 160)
    out = {}
    for batch in (1, 2, 4, 8, 16):
        runs = compare(engines, [prompt] * batch, tokens, 1)
        out[batch] = {
            "off": runs["off"]["tok_s"],
            "ngram": runs["ngram"]["tok_s"],
            "x": runs["ngram"]["speedup"],
        }
        print(
            f"batch {batch:2d}: off {out[batch]['off']:6.1f} tok/s, ngram {out[batch]['ngram']:6.1f} tok/s"
            f" = {out[batch]['x']:.2f}x, identical {runs['ngram']['identical']}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global CLOCK
    args = parse_args(argv)
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"loading {args.model or 'SmolLM2-135M'} (torch threads {torch.get_num_threads()}),"
        f" load average {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    loaded = load_model(args.model, device="cpu")
    engines = {"off": make_engine(loaded, None, args.k), "ngram": make_engine(loaded, "ngram", args.k)}
    if args.draft:
        engines["draft"] = make_engine(loaded, f"draft:{args.draft}", min(args.k, 5))
    figures: dict[str, Any] = {"k": args.k, "tokens": args.tokens, "repeats": args.repeats}
    figures["verify_cost"] = verify_cost(loaded)
    figures["single_stream"] = single_stream(args, loaded, engines)
    if args.crossover:
        figures["crossover"] = crossover(args, loaded)
    figures["load_average"] = os.getloadavg()[0]
    print(f"1-minute load average at the end: {figures['load_average']:.1f} (this machine is shared)")
    for runs in figures["single_stream"].values():
        for run in runs.values():
            run.pop("outputs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main()
