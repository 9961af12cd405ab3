"""Benchmark part (used by ``benchmarks.bench``): the targets and the printed table.
Turns the results of one run into rows of figure, target and verdict, the single-stream
and memory rows included.
"""

from __future__ import annotations

from typing import Any

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


def print_table(r: dict[str, Any]) -> None:
    rows = [*throughput_rows(r), *machine_rows(r), *single_stream_rows(r)]
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    print()
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())


def meets_target(ratios: dict[str, Any], name: str, lower_is_better: bool = False) -> str:
    if ratios[name] is None:
        return "not measured"
    good = ratios[name] <= TARGETS[name] if lower_is_better else ratios[name] >= TARGETS[name]
    return "yes" if good else "NO"


def throughput_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    ratios, t = r["ratios"], TARGETS
    seq, static = r["hf_sequential"], r["hf_static_batches"]
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
    return [
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
            meets_target(ratios, "ours_vs_hf_static"),
        ),
        (
            "ours / HF sequential",
            f"{ratios['ours_vs_hf_sequential']:.2f}x",
            f">= {t['ours_vs_hf_sequential']}x",
            meets_target(ratios, "ours_vs_hf_sequential"),
        ),
    ]


def machine_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    ratios, t, m = r["ratios"], TARGETS, r["machine"]
    return [
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
            meets_target(ratios, "fraction_of_matmul_bound"),
        ),
        (
            "multi-turn prefix hit rate",
            f"{ratios['multi_turn_hit_rate']:.1%}",
            f">= {t['multi_turn_hit_rate']:.0%}",
            meets_target(ratios, "multi_turn_hit_rate"),
        ),
        ("TTFT per turn (ms)", " ".join(f"{x:.0f}" for x in r["multi_turn"]["ttft_ms_by_turn"]), "", ""),
        (
            "TTFT turn 6 / turn 1",
            f"{ratios['ttft_turn6_over_turn1']:.2f}",
            f"<= {t['ttft_turn6_over_turn1']}",
            meets_target(ratios, "ttft_turn6_over_turn1", True),
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
            meets_target(ratios, "kv_waste_at_peak", True),
        ),
    ]


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
