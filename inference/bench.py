"""Benchmark: our engine against transformers ``generate()`` on the same weights.

    python -m inference.bench [--model DIR] [--json FILE] [--quick] [--threads N] [--memory-pressure]

Workloads (issue 3), on the default model or any supported ``--model``, in one
process, no Django (an MLA model also runs ``inference.bench_mla``'s comparison):
- throughput: 64 chat requests, prompts of 20-400 tokens, outputs of 16-256 tokens
  (ignore_eos), all submitted at once. Output tokens/s for our engine, for HF
  ``generate`` one request at a time, and for HF in static left-padded batches of 16
  (each batch runs to its longest output). The machine's fp32 matmul FLOP/s and
  memory bandwidth, measured here, give tokens/s bounds for this model.
- multi-turn: 8 conversations x 6 turns; prefix-cache hit rate over the history
  tokens and time to first token per turn.
- KV waste: allocated but unfilled token slots / allocated slots, at peak use.
- memory pressure (issue 14, ``inference.bench_memory``): 48 conversations over a pool
  holding a third of them, KV tiers off and on; ``--memory-pressure`` runs it alone.
- single stream (issue 15): one request's decode tokens/s against the bandwidth bound
  of the weight bytes it reads per token; resident memory after load split into
  weights, KV pool and the rest; and, unless ``--no-fp32-baseline``, the same
  single-stream and 64-request figures for the de-quantized fp32 weights (the path
  before quantized weights) in the same run, as ratios.

Over 500 lines: a tool, not a runtime module; the workloads and the report table are
kept together so one run prints ratios measured in one process. Other workloads
live in bench_memory.py, bench_mla.py and bench_single_stream.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inference.bench_memory import print_memory_pressure, run_memory_pressure
from inference.bench_mla import compare_without_mla, print_mla_table
from inference.bench_single_stream import (
    memory_breakdown,
    resident_bytes,
    single_stream_decode,
    single_stream_per_op,
    weight_bytes,
)
from inference.config import EngineConfig
from inference.engine import LLMEngine
from inference.model_files import default_model_path
from inference.model_loader import ensure_gguf_converted, load_model
from inference.sampling_params import SamplingParams

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part river mountain garden kitchen engine market science music history planet ocean"
).split()

TARGETS = {
    "ours_vs_hf_static": 2.0,
    "ours_vs_hf_sequential": 10.0,
    "fraction_of_matmul_bound": 0.40,
    "multi_turn_hit_rate": 0.90,
    "ttft_turn6_over_turn1": 1.5,
    "kv_waste_at_peak": 0.04,
    "single_stream_fraction_of_bandwidth_bound": 0.70,
    "throughput_quantized_over_fp32": 1.0,
}
MEMORY_TARGET_BYTES = 600e6  # resident memory less the KV pool, default model


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def chat_prompt(tokenizer: Any, rng: random.Random, target_len: int) -> list[int]:
    """A one-message chat prompt of about ``target_len`` tokens (never fewer)."""
    words: list[str] = []
    ids = tokenizer.encode_chat([{"role": "user", "content": "Summarise:"}])
    while len(ids) < target_len:
        words += [rng.choice(WORDS) for _ in range(max(1, (target_len - len(ids)) // 2))]
        ids = tokenizer.encode_chat([{"role": "user", "content": "Summarise: " + " ".join(words)}])
    return ids


def make_throughput_workload(tokenizer: Any, num_requests: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = [chat_prompt(tokenizer, rng, rng.randint(20, 400)) for _ in range(num_requests)]
    return Workload(prompts, [rng.randint(16, 256) for _ in range(num_requests)])


# ---- machine limits ---------------------------------------------------------------------


def measure_matmul_flops(hidden: int, intermediate: int, rows: int) -> float:
    """Best fp32 GEMM rate over a square 1024^3 and the model's MLP shape at ``rows``
    tokens, through torch's BLAS and through our packed C kernel (whichever is faster
    is the machine's limit as far as this engine can know)."""
    from kernels import cpu_linear  # noqa: PLC0415 - only the CPU benchmark needs it

    best = 0.0
    for m, k, n in ((1024, 1024, 1024), (rows, hidden, intermediate)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        products = [lambda a=a, b=b: a @ b]
        if cpu_linear.available():
            packed = cpu_linear.pack_weight(b.t().contiguous())
            products.append(lambda a=a, packed=packed, n=n: cpu_linear.linear_packed(a, packed, n))
        for product in products:
            for _ in range(3):
                product()
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < 1.0:
                product()
                reps += 1
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start))
    return best


def measure_bandwidth() -> float:
    """Bytes/s of a large copy (read + write), like streaming the weights once per step."""
    src = torch.randn(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        dst.copy_(src)
        reps += 1
    return 2 * src.numel() * 4 * reps / (time.perf_counter() - start)


def workload_flops(mc: Any, workload: Workload) -> float:
    """Matmul FLOPs the workload needs at minimum: every prompt and output token through
    every linear layer, attention scores and values over its context, and the LM head
    once per output token (only sampled positions need logits)."""
    h, inter, layers = mc.hidden_size, mc.intermediate_size, mc.num_layers
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    per_token_linear = 2 * layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)
    if getattr(mc, "mla", None) is not None:
        per_token_linear, q = _mla_moe_linear_flops(mc), mc.num_heads * mc.mla.latent_dim
    total = 0.0
    for prompt, out in zip(workload.prompts, workload.output_lens, strict=True):
        tokens = len(prompt) + out - 1  # the last sampled token is never fed back
        total += tokens * per_token_linear + out * 2 * h * mc.vocab_size
        context_sum = tokens * (tokens + 1) / 2  # token i attends to i + 1 keys
        total += 2 * 2 * layers * q * context_sum
    return total


def _mla_moe_linear_flops(mc: Any) -> float:
    """Per-token linear FLOPs of an MLA + MoE model as we run decode: the query (LoRA'd or
    not), the latent projection, the absorbed ``W_UK``/``W_UV`` products, the output
    projection, and the MLP (dense layers whole; MoE layers their router, the ``top_k``
    chosen experts and the shared ones)."""
    mla, moe, h, heads = mc.mla, mc.moe, mc.hidden_size, mc.num_heads
    q_out = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    q = h * q_out if mla.q_lora_rank is None else mla.q_lora_rank * (h + q_out)
    attn = q + h * mla.latent_dim + heads * mla.kv_lora_rank * (mla.qk_nope_head_dim + mla.v_head_dim)
    attn += heads * mla.v_head_dim * h
    dense_layers = moe.first_dense_layers if moe is not None else mc.num_layers
    moe_mlp = 0
    if moe is not None:
        moe_mlp = h * moe.num_experts + 3 * h * moe.intermediate_size * (moe.top_k + moe.num_shared_experts)
    mlp = dense_layers * 3 * h * mc.intermediate_size + (mc.num_layers - dense_layers) * moe_mlp
    return 2 * (mc.num_layers * attn + mlp)


# ---- our engine ---------------------------------------------------------------------------


def run_ours_throughput(engine: LLMEngine, workload: Workload) -> dict[str, Any]:
    engine.block_manager.reset_prefix_cache()
    engine.peak_kv_blocks_used, engine.kv_waste_at_peak = 0, 0.0
    start = time.perf_counter()
    requests = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        for p, n in zip(workload.prompts, workload.output_lens, strict=True)
    ]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    produced = sum(len(engine.request_output(r).token_ids) for r in requests)
    assert produced == workload.output_tokens, (produced, workload.output_tokens)
    return {
        "seconds": elapsed,
        "output_tokens": produced,
        "tokens_per_s": produced / elapsed,
        "steps": steps,
        "preemptions": engine.scheduler.num_preemptions,
        "peak_kv_blocks_used": engine.peak_kv_blocks_used,
        "kv_waste_at_peak": engine.kv_waste_at_peak,
    }


def run_multi_turn(engine: LLMEngine, conversations: int, turns: int, answer_tokens: int) -> dict[str, Any]:
    """All conversations send turn k together; each turn's prompt extends the previous
    turn's prompt + answer ids exactly (stored token ids, never re-tokenised text)."""
    tok = engine.tokenizer
    rng = random.Random(1)
    engine.block_manager.reset_prefix_cache()
    histories: list[list[dict[str, Any]]] = [[] for _ in range(conversations)]
    previous: list[list[int]] = [[] for _ in range(conversations)]
    ttft_by_turn: list[float] = []
    hit_tokens = history_tokens = 0
    for turn in range(turns):
        requests = []
        for c in range(conversations):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30)))
            histories[c].append({"role": "user", "content": f"Turn {turn + 1}: {question}?"})
            prompt = tok.encode_chat(histories[c])
            if turn:
                assert prompt[: len(previous[c])] == previous[c], "history must be a token prefix"
                history_tokens += len(previous[c])
            params = SamplingParams(temperature=0, max_tokens=answer_tokens, ignore_eos=True)
            requests.append((c, prompt, engine.add_request(prompt, params)))
        while engine.has_unfinished():
            engine.step()
        ttfts = []
        for c, prompt, request in requests:
            out = engine.request_output(request)
            ttfts.append(request.first_token_time - request.arrival_time)
            if turn:
                hit_tokens += request.num_cached_tokens
            histories[c].append({"role": "assistant", "content": out.text, "token_ids": out.token_ids})
            previous[c] = prompt + out.token_ids
        ttft_by_turn.append(statistics.mean(ttfts))
    return {
        "conversations": conversations,
        "turns": turns,
        "hit_rate": hit_tokens / history_tokens if history_tokens else 0.0,
        "hit_tokens": hit_tokens,
        "history_tokens": history_tokens,
        "ttft_ms_by_turn": [t * 1000 for t in ttft_by_turn],
        "ttft_turn_last_over_first": ttft_by_turn[-1] / ttft_by_turn[0],
    }


# ---- the transformers baseline ---------------------------------------------------------------


def hf_generate(hf: Any, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> None:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=None,
        )


def run_hf_sequential(hf: Any, workload: Workload, indices: list[int], pad_id: int) -> dict[str, Any]:
    start = time.perf_counter()
    for i in indices:
        hf_generate(hf, [workload.prompts[i]], workload.output_lens[i], pad_id)
    elapsed = time.perf_counter() - start
    tokens = sum(workload.output_lens[i] for i in indices)
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "requests_measured": len(indices),
        "requests_total": len(workload.prompts),
    }


def run_hf_static(
    hf: Any, workload: Workload, batch_size: int, batches: list[int], pad_id: int
) -> dict[str, Any]:
    start = time.perf_counter()
    tokens = 0
    for b in batches:
        idx = range(b * batch_size, min((b + 1) * batch_size, len(workload.prompts)))
        lens = [workload.output_lens[i] for i in idx]
        hf_generate(hf, [workload.prompts[i] for i in idx], max(lens), pad_id)
        tokens += sum(lens)  # useful tokens; the padding steps past each one's length are waste
    elapsed = time.perf_counter() - start
    total_batches = -(-len(workload.prompts) // batch_size)
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "batches_measured": len(batches),
        "batches_total": total_batches,
        "batch_size": batch_size,
    }


# ---- report ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_pressure:
        return _memory_pressure_only(args)
    from transformers import AutoModelForCausalLM

    num_requests = 16 if args.quick else 64
    print(
        f"loading {args.model or 'the default model'} (torch threads: {torch.get_num_threads()}) ...",
        file=sys.stderr,
    )
    rss_before_model = resident_bytes()
    loaded = load_model(args.model, device="cpu")
    model, tokenizer, mc = loaded
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
    # Warm-up (allocator, thread pools) for both, untimed.
    run_ours_throughput(engine, Workload(workload.prompts[:2], [4, 4]))
    hf_generate(hf, workload.prompts[:1], 4, pad_id)

    loads = [os.getloadavg()[0]]  # other processes on this machine skew every figure: report it
    print("measuring machine limits ...", file=sys.stderr)
    flops = measure_matmul_flops(mc.hidden_size, mc.intermediate_size, config.max_num_batched_tokens)
    bandwidth = measure_bandwidth()
    print("our engine: single stream ...", file=sys.stderr)
    stream_prompt = chat_prompt(tokenizer, random.Random(2), 60)
    single = single_stream_decode(engine, stream_prompt, args.decode_tokens)
    single["per_op"] = single_stream_per_op(engine, stream_prompt, args.decode_tokens)
    print("our engine: throughput ...", file=sys.stderr)
    ours = run_ours_throughput(engine, workload)
    loads.append(os.getloadavg()[0])
    fp32: dict[str, Any] | None = None
    if not args.no_fp32_baseline and source.suffix == ".gguf":
        print("fp32 baseline (de-quantized weights): single stream, throughput ...", file=sys.stderr)
        fp32_loaded = load_model(args.model, device="cpu", quantized=False)
        fp32_engine = LLMEngine(config, loaded=fp32_loaded)
        run_ours_throughput(fp32_engine, Workload(workload.prompts[:2], [4, 4]))
        fp32 = {
            "weight_bytes": weight_bytes(fp32_loaded[0]),
            "single_stream": single_stream_decode(fp32_engine, stream_prompt, args.decode_tokens),
            "throughput": run_ours_throughput(fp32_engine, workload),
        }
        del fp32_engine, fp32_loaded
        loads.append(os.getloadavg()[0])
    print("our engine: multi-turn ...", file=sys.stderr)
    multi = run_multi_turn(engine, conversations=4 if args.quick else 8, turns=6, answer_tokens=48)
    loads.append(os.getloadavg()[0])
    print("transformers: static batches ...", file=sys.stderr)
    batches = list(range(-(-num_requests // 16)))
    if args.static_batches:
        batches = batches[: args.static_batches]
    if args.quick:
        batches = batches[:1]
    static = run_hf_static(hf, workload, 16, batches, pad_id)
    loads.append(os.getloadavg()[0])
    print("transformers: sequential ...", file=sys.stderr)
    count = args.sequential_requests or num_requests
    if args.quick:
        count = min(count, 4)
    # An evenly spaced subset keeps the mix of prompt and output lengths.
    indices = sorted({round(i * (num_requests - 1) / max(1, count - 1)) for i in range(count)})
    sequential = run_hf_sequential(hf, workload, indices, pad_id)

    loads.append(os.getloadavg()[0])
    read_per_token = weight_bytes(model)
    needed = workload_flops(mc, workload)
    compute_bound_tps = workload.output_tokens / (needed / flops)
    results = {
        "model": engine.model_name,
        "threads": torch.get_num_threads(),
        "load_average_1min": loads,  # before measuring, then after each phase
        "workload": {
            "requests": num_requests,
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
        },
        "ours": ours,
        "hf_sequential": sequential,
        "hf_static_batches": static,
        "machine": {
            "matmul_flops": flops,
            "bandwidth_bytes_per_s": bandwidth,
            "workload_flops": needed,
            "compute_bound_tokens_per_s": compute_bound_tps,
            "weight_bytes": read_per_token,
            "memory_bound_decode_tokens_per_s_batch1": bandwidth / read_per_token,
        },
        "single_stream": single,
        "memory": memory,
        "fp32_baseline": fp32,
        "multi_turn": multi,
        "ratios": {
            "ours_vs_hf_static": ours["tokens_per_s"] / static["tokens_per_s"],
            "ours_vs_hf_sequential": ours["tokens_per_s"] / sequential["tokens_per_s"],
            "fraction_of_matmul_bound": ours["tokens_per_s"] / compute_bound_tps,
            "multi_turn_hit_rate": multi["hit_rate"],
            "ttft_turn6_over_turn1": multi["ttft_turn_last_over_first"],
            "kv_waste_at_peak": ours["kv_waste_at_peak"],
            "single_stream_fraction_of_bandwidth_bound": single["tokens_per_s"] * read_per_token / bandwidth,
            "throughput_quantized_over_fp32": (
                ours["tokens_per_s"] / fp32["throughput"]["tokens_per_s"] if fp32 else None
            ),
            "single_stream_quantized_over_fp32": (
                single["tokens_per_s"] / fp32["single_stream"]["tokens_per_s"] if fp32 else None
            ),
        },
        "targets": TARGETS,
    }
    if mc.mla is not None:
        print("MLA against the same size without MLA ...", file=sys.stderr)
        short = [min(n, 64) for n in workload.output_lens]  # keeps the extra runs short
        results["mla"] = compare_without_mla(loaded, workload.prompts, short, config)
    print("our engine: memory pressure (KV tiers off and on) ...", file=sys.stderr)
    results["memory_pressure"] = run_memory_pressure(loaded, quick=args.quick, tiers_first=args.tiers_first)
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


def print_table(r: dict[str, Any]) -> None:
    ratios, t = r["ratios"], TARGETS
    seq, static, m = r["hf_sequential"], r["hf_static_batches"], r["machine"]

    def ok(name: str, lower_is_better: bool = False) -> str:
        if ratios[name] is None:
            return "not measured"
        good = ratios[name] <= t[name] if lower_is_better else ratios[name] >= t[name]
        return "yes" if good else "NO"

    seq_note = (
        f"measured on {seq['requests_measured']} of {seq['requests_total']} requests, rate extrapolated"
        if seq["requests_measured"] < seq["requests_total"]
        else "all requests"
    )
    static_note = (
        f"{static['batches_measured']} of {static['batches_total']} batches of {static['batch_size']}"
        if static["batches_measured"] < static["batches_total"]
        else f"all {static['batches_total']} batches of {static['batch_size']}"
    )
    w = r["workload"]
    rows = [
        (
            "workload",
            f"{w['requests']} chat requests, {w['prompt_tokens']} prompt + {w['output_tokens']} output tokens",
            "",
            "",
        ),
        (
            "ours: output tokens/s",
            f"{r['ours']['tokens_per_s']:.1f}",
            "",
            f"{r['ours']['seconds']:.1f} s, {r['ours']['preemptions']} preemptions",
        ),
        ("HF generate sequential: tokens/s", f"{seq['tokens_per_s']:.1f}", "", seq_note),
        ("HF generate static batches: tokens/s", f"{static['tokens_per_s']:.1f}", "", static_note),
        (
            "ours / HF static",
            f"{ratios['ours_vs_hf_static']:.2f}x",
            f">= {t['ours_vs_hf_static']}x",
            ok("ours_vs_hf_static"),
        ),
        (
            "ours / HF sequential",
            f"{ratios['ours_vs_hf_sequential']:.2f}x",
            f">= {t['ours_vs_hf_sequential']}x",
            ok("ours_vs_hf_sequential"),
        ),
        ("fp32 matmul (measured)", f"{m['matmul_flops'] / 1e9:.1f} GFLOP/s", "", ""),
        ("memory bandwidth (measured)", f"{m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s", "", ""),
        (
            "compute bound for this workload",
            f"{m['compute_bound_tokens_per_s']:.1f} tok/s",
            "",
            f"{m['workload_flops'] / 1e12:.2f} TFLOP",
        ),
        (
            "memory bound, decode batch 1",
            f"{m['memory_bound_decode_tokens_per_s_batch1']:.1f} tok/s",
            "",
            f"{m['weight_bytes'] / 1e6:.0f} MB weights",
        ),
        (
            "ours / compute bound",
            f"{ratios['fraction_of_matmul_bound']:.0%}",
            f">= {t['fraction_of_matmul_bound']:.0%}",
            ok("fraction_of_matmul_bound"),
        ),
        (
            "multi-turn prefix hit rate",
            f"{ratios['multi_turn_hit_rate']:.1%}",
            f">= {t['multi_turn_hit_rate']:.0%}",
            ok("multi_turn_hit_rate"),
        ),
        ("TTFT per turn (ms)", " ".join(f"{x:.0f}" for x in r["multi_turn"]["ttft_ms_by_turn"]), "", ""),
        (
            "TTFT turn 6 / turn 1",
            f"{ratios['ttft_turn6_over_turn1']:.2f}",
            f"<= {t['ttft_turn6_over_turn1']}",
            ok("ttft_turn6_over_turn1", True),
        ),
        (
            "machine load (1-min avg)",
            " ".join(f"{x:.1f}" for x in r["load_average_1min"]),
            "",
            f"{r['threads']} torch threads; above that, other processes shared the CPU",
        ),
        (
            "KV waste at peak",
            f"{ratios['kv_waste_at_peak']:.2%}",
            f"< {t['kv_waste_at_peak']:.0%}",
            ok("kv_waste_at_peak", True),
        ),
        *single_stream_rows(r),
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    print()
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())


def single_stream_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    ratios, t, m, mem = r["ratios"], TARGETS, r["machine"], r["memory"]
    single, fp32 = r["single_stream"], r["fp32_baseline"]
    share = ratios["single_stream_fraction_of_bandwidth_bound"]
    less_kv = mem["rss"] - mem["kv_pool_allocated"]
    rows = [
        (
            "single stream decode: tokens/s",
            f"{single['tokens_per_s']:.1f}",
            "",
            f"{single['tokens']} greedy tokens after a {single['prompt_tokens']}-token prompt",
        ),
    ]
    if single.get("per_op"):
        per_op = single["per_op"]["tokens_per_s"]
        rows.append(
            (
                "  one-call decode step over per-op calls",
                f"{single['tokens_per_s'] / per_op:.2f}x",
                "",
                f"per-op path {per_op:.1f} tokens/s (each layer's kernels called from Python)",
            )
        )
    rows += [
        (
            "  share of the bandwidth bound",
            f"{share:.0%}",
            f">= {t['single_stream_fraction_of_bandwidth_bound']:.0%}",
            f"{'yes' if share >= t['single_stream_fraction_of_bandwidth_bound'] else 'NO'}: "
            f"{m['weight_bytes'] / 1e6:.0f} MB read per token",
        ),
        (
            "memory after load (RSS)",
            f"{mem['rss'] / 1e6:.0f} MB",
            "",
            f"weights {mem['weights'] / 1e6:.0f} MB, KV pool {mem['kv_pool_allocated'] / 1e6:.0f} MB allocated, "
            f"rest {mem['rest'] / 1e6:.0f} MB",
        ),
        (
            "  RSS less the KV pool",
            f"{less_kv / 1e6:.0f} MB",
            f"< {MEMORY_TARGET_BYTES / 1e6:.0f} MB",
            "yes" if less_kv < MEMORY_TARGET_BYTES else "NO",
        ),
    ]
    if fp32:
        rows += [
            (
                "fp32 weights (same run): single stream",
                f"{fp32['single_stream']['tokens_per_s']:.1f} tok/s",
                "",
                f"quantized / fp32 = {ratios['single_stream_quantized_over_fp32']:.2f}x, "
                f"{fp32['weight_bytes'] / 1e6:.0f} MB of weights",
            ),
            (
                "fp32 weights (same run): 64-request throughput",
                f"{fp32['throughput']['tokens_per_s']:.1f} tok/s",
                f">= {t['throughput_quantized_over_fp32']:.1f}x",
                f"quantized / fp32 = {ratios['throughput_quantized_over_fp32']:.2f}x",
            ),
        ]
    return rows


if __name__ == "__main__":
    main()
