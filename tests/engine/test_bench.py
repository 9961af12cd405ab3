"""The benchmark's workloads and measurements, run small on the tiny model (the real
benchmark is ``python -m benchmarks.bench``)."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.bench_runs import run_multi_turn, run_ours_throughput
from benchmarks.bench_workload import Workload, make_throughput_workload, workload_flops
from tests.engine.engine_fixtures import TinyModel


def test_throughput_workload_has_the_specified_shape(tiny: TinyModel) -> None:
    workload = make_throughput_workload(tiny.tokenizer, 12)
    assert len(workload.prompts) == 12
    assert all(20 <= len(p) <= 420 for p in workload.prompts)
    assert all(16 <= n <= 256 for n in workload.output_lens)
    chat_start = tiny.tokenizer.encode_chat([{"role": "user", "content": "x"}])[:3]
    assert all(p[:3] == chat_start for p in workload.prompts)


def test_throughput_run_produces_every_token_and_reports_kv_waste(tiny: TinyModel) -> None:
    workload = Workload([[5, 6, 7] * 10, [9] * 40, [11, 12] * 7], [5, 17, 3])
    result = run_ours_throughput(tiny.engine(), workload)
    assert result["output_tokens"] == 25 and result["tokens_per_s"] > 0
    assert 0 < result["kv_waste_at_peak"] < 1 and result["peak_kv_blocks_used"] > 0


def test_multi_turn_reuses_history_and_times_every_turn(tiny: TinyModel) -> None:
    result = run_multi_turn(tiny.engine(), conversations=2, turns=3, answer_tokens=20)
    assert len(result["ttft_ms_by_turn"]) == 3
    assert result["hit_rate"] > 0.8 and result["hit_tokens"] <= result["history_tokens"]


def test_workload_flops_counts_linear_layers_head_and_attention() -> None:
    mc = SimpleNamespace(
        hidden_size=4,
        intermediate_size=8,
        num_layers=1,
        num_heads=2,
        head_dim=2,
        num_kv_heads=1,
        vocab_size=10,
    )
    flops = workload_flops(mc, Workload([[1, 2]], [2]))  # 3 tokens fed, 2 sampled
    linear = 2 * (4 * 4 + 2 * 4 * 2 + 4 * 4 + 3 * 4 * 8)
    assert flops == 3 * linear + 2 * 2 * 4 * 10 + 2 * 2 * 4 * (1 + 2 + 3)


def test_memory_pressure_workload_counts_recomputation_and_tier_hits(tiny: TinyModel, tmp_path) -> None:
    from benchmarks.bench_memory import _questions, pool_blocks_for_a_third, run_conversations

    questions = _questions(6, 2, words=(20, 30))
    blocks = pool_blocks_for_a_third(tiny.tokenizer, questions, 4, 16)
    first_turns = sum(
        len(tiny.tokenizer.encode_chat([{"role": "user", "content": q[0]}])) // 16 for q in questions
    )
    assert first_turns <= 3 * blocks  # a third of what the final histories need
    off = run_conversations(tiny.engine(num_kv_blocks=blocks), questions, 4, {0}, retain=False)
    on = run_conversations(
        tiny.engine(num_kv_blocks=blocks, kv_disk_dir=str(tmp_path)), questions, 4, {0}, retain=True
    )
    assert off.pop("outputs") == on.pop("outputs")  # the tiers never change an answer
    assert len(on["ttft_ms_by_turn"]) == 2 and on["output_tokens"] == 6 * 2 * 4
    assert on["recomputed_tokens"] <= off["recomputed_tokens"]
    assert on["next_turn_hit_rate_open"] >= 0.9 and "disk" in on["hit_tokens_by_tier"]


def test_single_stream_and_memory_breakdown(tiny: TinyModel) -> None:
    from benchmarks.bench_single_stream import (
        memory_breakdown,
        single_stream_decode,
        single_stream_per_op,
        weight_bytes,
    )

    engine = tiny.engine()
    result = single_stream_decode(engine, [5, 6, 7, 8], 6)
    assert result["tokens_per_s"] > 0 and result["tokens"] == 6
    stack = engine.model.decode_stack
    assert stack is not None  # the tiny fp32 model's released panels qualify
    assert single_stream_per_op(engine, [5, 6, 7, 8], 6)["tokens_per_s"] > 0
    assert engine.model.decode_stack is stack  # turned back on
    memory = memory_breakdown(engine, 0)
    pool = engine.runner.kv_cache
    assert memory["kv_pool_allocated"] == pool.numel() * pool.element_size()
    assert memory["weights"] == weight_bytes(engine.model) > 0
    assert memory["rss"] >= memory["weights"] and memory["rest"] >= 0


def test_single_stream_rows_report_the_one_call_step_against_per_op_calls() -> None:
    from benchmarks.bench_report import single_stream_rows

    results = {
        "ratios": {"single_stream_fraction_of_bandwidth_bound": 0.5},
        "machine": {"weight_bytes": 112e6},
        "memory": {"rss": 900e6, "kv_pool_allocated": 400e6, "weights": 112e6, "rest": 388e6},
        "single_stream": {
            "tokens_per_s": 150.0,
            "tokens": 128,
            "prompt_tokens": 60,
            "per_op": {"tokens_per_s": 100.0},
        },
        "fp32_baseline": None,
    }
    rows = {row[0].strip(): row for row in single_stream_rows(results)}
    assert rows["one-call decode step over per-op calls"][1] == "1.50x"
    assert rows["share of the bandwidth bound"][1] == "50%" and rows["share of the bandwidth bound"][
        3
    ].startswith("NO")
    assert rows["RSS less the KV pool"][1] == "500 MB"


def test_the_report_prints_every_ratio_against_its_target(capsys) -> None:
    from benchmarks.bench import ratios
    from benchmarks.bench_report import TARGETS, print_table

    runs = {
        "ours": {"tokens_per_s": 300.0, "seconds": 10.0, "preemptions": 0, "kv_waste_at_peak": 0.01},
        "hf_static_batches": {
            "tokens_per_s": 100.0,
            "batches_measured": 1,
            "batches_total": 4,
            "batch_size": 16,
        },
        "hf_sequential": {"tokens_per_s": 30.0, "requests_measured": 8, "requests_total": 64},
        "single_stream": {"tokens_per_s": 150.0, "tokens": 128, "prompt_tokens": 60},
        "fp32_baseline": None,
        "multi_turn": {"hit_rate": 0.9, "ttft_turn_last_over_first": 1.2, "ttft_ms_by_turn": [10.0, 12.0]},
    }
    machine = {
        "matmul_flops": 1e11,
        "bandwidth_bytes_per_s": 2e10,
        "workload_flops": 1e12,
        "compute_bound_tokens_per_s": 1000.0,
        "weight_bytes": 1e8,
        "memory_bound_decode_tokens_per_s_batch1": 200.0,
    }
    computed = ratios(runs, machine)
    assert computed["ours_vs_hf_static"] == 3.0 and computed["ours_vs_hf_sequential"] == 10.0
    assert computed["single_stream_fraction_of_bandwidth_bound"] == 0.75
    assert computed["throughput_quantized_over_fp32"] is None
    results = {
        **runs,
        "ratios": computed,
        "machine": machine,
        "workload": {"requests": 64, "prompt_tokens": 1000, "output_tokens": 2000},
        "load_average_1min": [0.5, 1.0],
        "threads": 2,
        "memory": {"rss": 900e6, "kv_pool_allocated": 400e6, "weights": 112e6, "rest": 388e6},
        "targets": TARGETS,
    }
    print_table(results)
    lines = {line.strip().split("  ")[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert "3.00x" in lines["ours / HF static"] and lines["ours / HF static"].endswith("yes")
    assert "30%" in lines["ours / compute bound"]
    assert "75%" in lines["share of the bandwidth bound"]
