"""Benchmark: our engine against transformers ``generate()`` on the same weights.

    python -m benchmarks.bench [--model DIR] [--json FILE] [--quick] [--threads N] [--memory-pressure]

Workloads, on the default model or any supported ``--model``, in one
process, no Django (an MLA model also runs ``benchmarks.bench_mla``'s comparison):
- throughput: 64 chat requests, prompts of 20-400 tokens, outputs of 16-256 tokens
  (ignore_eos), all submitted at once. Output tokens/s for our engine, for HF
  ``generate`` one request at a time, and for HF in static left-padded batches of 16
  (each batch runs to its longest output). The machine's fp32 matmul FLOP/s and
  memory bandwidth, measured here, give tokens/s bounds for this model.
- multi-turn: 8 conversations x 6 turns; prefix-cache hit rate over the history
  tokens and time to first token per turn.
- KV waste: allocated but unfilled token slots / allocated slots, at peak use.
- memory pressure (``benchmarks.bench_memory``): 48 conversations over a pool
  holding a third of them, KV tiers off and on; ``--memory-pressure`` runs it alone.
- single stream: one request's decode tokens/s against the bandwidth bound
  of the weight bytes it reads per token; resident memory after load split into
  weights, KV pool and the rest; and, unless ``--no-fp32-baseline``, the same
  single-stream and 64-request figures for the de-quantized fp32 weights (the path
  before quantized weights) in the same run, as ratios.

This module parses the arguments, runs the parts in order and writes the JSON; the
parts live in bench_workload.py (workload, FLOPs, machine limits), bench_runs.py (our
engine and the transformers baseline), bench_report.py (targets and table),
bench_memory.py, bench_mla.py and bench_single_stream.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_memory import print_memory_pressure, run_memory_pressure
from benchmarks.bench_mla import compare_without_mla, print_mla_table
from benchmarks.bench_report import TARGETS, print_table
from benchmarks.bench_runs import (
    hf_generate,
    run_hf_sequential,
    run_hf_static,
    run_multi_turn,
    run_ours_throughput,
)
from benchmarks.bench_single_stream import (
    memory_breakdown,
    resident_bytes,
    single_stream_decode,
    single_stream_per_op,
    weight_bytes,
)
from benchmarks.bench_workload import (
    Workload,
    chat_prompt,
    make_throughput_workload,
    measure_bandwidth,
    measure_matmul_flops,
    workload_flops,
)
from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_files import default_model_path
from inference.runner.model_loader import ensure_gguf_converted, load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a smaller run (16 requests, 1 static batch)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--model", help="a Hugging Face model directory or .gguf file (default: the SmolLM2 GGUF)"
    )
    parser.add_argument(
        "--sequential-requests",
        type=int,
        default=8,
        help="requests the sequential HF baseline runs; its rate is extrapolated (0 = all)",
    )
    parser.add_argument("--static-batches", type=int, default=0, help="HF static batches to run (0 = all)")
    parser.add_argument(
        "--memory-pressure", action="store_true", help="run only the memory-pressure workload (KV tiers)"
    )
    parser.add_argument("--tiers-first", action="store_true", help="memory pressure: run tiers on before off")
    parser.add_argument(
        "--no-fp32-baseline", action="store_true", help="skip the de-quantized fp32 comparison runs"
    )
    parser.add_argument("--decode-tokens", type=int, default=128, help="single-stream decode length")
    return parser.parse_args(argv)


@dataclass
class Setup:
    """Everything loaded once and shared by the phases of a run."""

    args: argparse.Namespace
    loaded: Any
    config: EngineConfig
    engine: LLMEngine
    hf: Any
    pad_id: int
    source: Path
    workload: Workload
    memory: dict[str, Any]
    loads: list[float] = field(default_factory=list)  # 1-min load average after each phase

    def note_load(self) -> None:
        self.loads.append(os.getloadavg()[0])


def load_setup(args: argparse.Namespace) -> Setup:
    from transformers import AutoModelForCausalLM

    num_requests = 16 if args.quick else 64
    print(
        f"loading {args.model or 'the default model'} (torch threads: {torch.get_num_threads()}) ...",
        file=sys.stderr,
    )
    rss_before_model = resident_bytes()
    loaded = load_model(args.model, device="cpu")
    tokenizer = loaded[1]
    config = EngineConfig(model=args.model)
    engine = LLMEngine(config, loaded=loaded)
    memory = memory_breakdown(engine, rss_before_model)  # before anything else is loaded
    source = Path(args.model).expanduser() if args.model else default_model_path()
    hf_dir = ensure_gguf_converted(source) if source.suffix == ".gguf" else source
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    pad_id = tokenizer.hf.pad_token_id if tokenizer.hf.pad_token_id is not None else 0
    workload = make_throughput_workload(tokenizer, num_requests)
    print(
        f"workload: {num_requests} requests, {workload.prompt_tokens} prompt + {workload.output_tokens} output tokens",
        file=sys.stderr,
    )
    return Setup(args, loaded, config, engine, hf, pad_id, source, workload, memory)


def run_fp32_baseline(setup: Setup, stream_prompt: list[int]) -> dict[str, Any] | None:
    """The de-quantized fp32 weights through the same engine: the like-for-like comparison."""
    if setup.args.no_fp32_baseline or setup.source.suffix != ".gguf":
        return None
    print("fp32 baseline (de-quantized weights): single stream, throughput ...", file=sys.stderr)
    fp32_loaded = load_model(setup.args.model, device="cpu", quantized=False)
    fp32_engine = LLMEngine(setup.config, loaded=fp32_loaded)
    run_ours_throughput(fp32_engine, Workload(setup.workload.prompts[:2], [4, 4]))
    return {
        "weight_bytes": weight_bytes(fp32_loaded[0]),
        "single_stream": single_stream_decode(fp32_engine, stream_prompt, setup.args.decode_tokens),
        "throughput": run_ours_throughput(fp32_engine, setup.workload),
    }


def run_ours(setup: Setup) -> dict[str, Any]:
    args, engine = setup.args, setup.engine
    print("our engine: single stream ...", file=sys.stderr)
    stream_prompt = chat_prompt(setup.loaded[1], random.Random(2), 60)
    single = single_stream_decode(engine, stream_prompt, args.decode_tokens)
    single["per_op"] = single_stream_per_op(engine, stream_prompt, args.decode_tokens)
    print("our engine: throughput ...", file=sys.stderr)
    ours = run_ours_throughput(engine, setup.workload)
    setup.note_load()
    fp32 = run_fp32_baseline(setup, stream_prompt)
    if fp32 is not None:
        setup.note_load()
    print("our engine: multi-turn ...", file=sys.stderr)
    multi = run_multi_turn(engine, conversations=4 if args.quick else 8, turns=6, answer_tokens=48)
    setup.note_load()
    return {"single_stream": single, "ours": ours, "fp32_baseline": fp32, "multi_turn": multi}


def run_transformers(setup: Setup) -> dict[str, Any]:
    args, workload = setup.args, setup.workload
    num_requests = len(workload.prompts)
    print("transformers: static batches ...", file=sys.stderr)
    batches = list(range(-(-num_requests // 16)))
    if args.static_batches:
        batches = batches[: args.static_batches]
    if args.quick:
        batches = batches[:1]
    static = run_hf_static(setup.hf, workload, 16, batches, setup.pad_id)
    setup.note_load()
    print("transformers: sequential ...", file=sys.stderr)
    count = args.sequential_requests or num_requests
    if args.quick:
        count = min(count, 4)
    # An evenly spaced subset keeps the mix of prompt and output lengths.
    indices = sorted({round(i * (num_requests - 1) / max(1, count - 1)) for i in range(count)})
    sequential = run_hf_sequential(setup.hf, workload, indices, setup.pad_id)
    setup.note_load()
    return {"hf_sequential": sequential, "hf_static_batches": static}


def ratios(runs: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    ours, single, fp32, multi = runs["ours"], runs["single_stream"], runs["fp32_baseline"], runs["multi_turn"]
    return {
        "ours_vs_hf_static": ours["tokens_per_s"] / runs["hf_static_batches"]["tokens_per_s"],
        "ours_vs_hf_sequential": ours["tokens_per_s"] / runs["hf_sequential"]["tokens_per_s"],
        "fraction_of_matmul_bound": ours["tokens_per_s"] / machine["compute_bound_tokens_per_s"],
        "multi_turn_hit_rate": multi["hit_rate"],
        "ttft_turn6_over_turn1": multi["ttft_turn_last_over_first"],
        "kv_waste_at_peak": ours["kv_waste_at_peak"],
        "single_stream_fraction_of_bandwidth_bound": (
            single["tokens_per_s"] * machine["weight_bytes"] / machine["bandwidth_bytes_per_s"]
        ),
        "throughput_quantized_over_fp32": (
            ours["tokens_per_s"] / fp32["throughput"]["tokens_per_s"] if fp32 else None
        ),
        "single_stream_quantized_over_fp32": (
            single["tokens_per_s"] / fp32["single_stream"]["tokens_per_s"] if fp32 else None
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_pressure:
        return _memory_pressure_only(args)
    setup = load_setup(args)
    workload, mc = setup.workload, setup.loaded[2]
    # Warm-up (allocator, thread pools) for both, untimed.
    run_ours_throughput(setup.engine, Workload(workload.prompts[:2], [4, 4]))
    hf_generate(setup.hf, workload.prompts[:1], 4, setup.pad_id)
    setup.note_load()  # other processes on this machine skew every figure: report it

    print("measuring machine limits ...", file=sys.stderr)
    flops = measure_matmul_flops(mc.hidden_size, mc.intermediate_size, setup.config.max_num_batched_tokens)
    bandwidth = measure_bandwidth()
    runs = run_ours(setup) | run_transformers(setup)
    read_per_token = weight_bytes(setup.loaded[0])
    needed = workload_flops(mc, workload)
    machine = {
        "matmul_flops": flops,
        "bandwidth_bytes_per_s": bandwidth,
        "workload_flops": needed,
        "compute_bound_tokens_per_s": workload.output_tokens / (needed / flops),
        "weight_bytes": read_per_token,
        "memory_bound_decode_tokens_per_s_batch1": bandwidth / read_per_token,
    }
    results = {
        "model": setup.engine.model_name,
        "threads": torch.get_num_threads(),
        "load_average_1min": setup.loads,  # before measuring, then after each phase
        "workload": {
            "requests": len(workload.prompts),
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
        },
        "ours": runs["ours"],
        "hf_sequential": runs["hf_sequential"],
        "hf_static_batches": runs["hf_static_batches"],
        "machine": machine,
        "single_stream": runs["single_stream"],
        "memory": setup.memory,
        "fp32_baseline": runs["fp32_baseline"],
        "multi_turn": runs["multi_turn"],
        "ratios": ratios(runs, machine),
        "targets": TARGETS,
    }
    if mc.mla is not None:
        print("MLA against the same size without MLA ...", file=sys.stderr)
        short = [min(n, 64) for n in workload.output_lens]  # keeps the extra runs short
        results["mla"] = compare_without_mla(setup.loaded, workload.prompts, short, setup.config)
    print("our engine: memory pressure (KV tiers off and on) ...", file=sys.stderr)
    results["memory_pressure"] = run_memory_pressure(
        setup.loaded, quick=args.quick, tiers_first=args.tiers_first
    )
    print_table(results)
    if "mla" in results:
        print_mla_table(results["mla"])
    print_memory_pressure(results["memory_pressure"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _memory_pressure_only(args: argparse.Namespace) -> dict[str, Any]:
    print(f"loading the model (torch threads: {torch.get_num_threads()}) ...", file=sys.stderr)
    loaded = load_model(args.model, device="cpu")
    loads = [os.getloadavg()[0]]
    results = run_memory_pressure(loaded, quick=args.quick, tiers_first=args.tiers_first)
    loads.append(os.getloadavg()[0])
    results["load_average_1min"] = loads  # other processes on the machine skew every figure
    print_memory_pressure(results)
    print(f"machine load (1-min avg) before / after: {loads[0]:.1f} / {loads[1]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
