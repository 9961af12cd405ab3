"""Benchmark part for MLA models (``python -m benchmarks.bench --model DIR`` on a
DeepSeek-V3 directory): the same workload through the MLA model and through a
same-size model without MLA, in one process, reported as ratios.

The model without MLA is a Llama-family decoder with DeepSeek's vocabulary, hidden
size, layer count and heads, each head caching K and V of ``qk_head_dim`` (what
DeepSeek's attention caches once expanded), and a dense MLP of the dense layers'
width; its weights are random (the workload ignores EOS, so every run produces the
same number of tokens).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.model_config import ModelConfig
from inference.models import LlamaForCausalLM
from inference.sampling.params import SamplingParams


def without_mla(mc: ModelConfig) -> ModelConfig:
    """``mc``'s sizes as a Llama config: full multi-head K/V cache, dense MLP."""
    return dataclasses.replace(
        mc,
        architecture="LlamaForCausalLM",
        num_kv_heads=mc.num_heads,
        head_dim=mc.head_dim,  # qk_head_dim for DeepSeek
        rope_scaling=None,
        attention_bias=False,
        mla=None,
        moe=None,
        name=f"{mc.name} without MLA",
    )


def _random_llama(mc: ModelConfig, dtype: torch.dtype) -> LlamaForCausalLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(mc)
        for name, param in model.named_parameters():
            if "norm" not in name:
                torch.nn.init.normal_(param, std=0.05)
    return model.to(dtype).eval()


def _throughput(engine: LLMEngine, prompts: list[list[int]], output_lens: list[int]) -> float:
    requests = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        for p, n in zip(prompts, output_lens, strict=True)
    ]
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - start
    produced = sum(len(engine.request_output(r).token_ids) for r in requests)
    assert produced == sum(output_lens), (produced, sum(output_lens))
    return produced / elapsed


def compare_without_mla(
    loaded: tuple[Any, Any, ModelConfig],
    prompts: list[list[int]],
    output_lens: list[int],
    config: EngineConfig,
) -> dict[str, Any]:
    """tokens/s and KV bytes per token of the MLA model and of ``without_mla`` on the
    same prompts, the MLA one measured first and again last (their mean is used, so a
    change in machine load during the run shows as a spread)."""
    model, tokenizer, mc = loaded
    dtype = next(model.parameters()).dtype
    plain_config = without_mla(mc)
    plain = _random_llama(plain_config, dtype)
    engines = {
        "mla": LLMEngine(config, loaded=loaded),
        "without_mla": LLMEngine(config, loaded=(plain, tokenizer, plain_config)),
    }
    for engine in engines.values():  # warm-up, untimed
        _throughput(engine, prompts[:2], [4, 4])
    rates = {"mla": [_throughput(engines["mla"], prompts, output_lens)]}
    rates["without_mla"] = [_throughput(engines["without_mla"], prompts, output_lens)]
    rates["mla"].append(_throughput(engines["mla"], prompts, output_lens))
    kv = {name: engine.kv_spec.bytes_per_token(dtype) for name, engine in engines.items()}
    mla_tps = sum(rates["mla"]) / len(rates["mla"])
    return {
        "requests": len(prompts),
        "output_tokens": sum(output_lens),
        "tokens_per_s": {"mla": mla_tps, "without_mla": rates["without_mla"][0], "mla_runs": rates["mla"]},
        "kv_bytes_per_token": kv,
        "kv_bytes_per_token_per_layer": {name: b // mc.num_layers for name, b in kv.items()},
        "ratios": {
            "tokens_per_s_mla_over_without": mla_tps / rates["without_mla"][0],
            "kv_bytes_per_token_mla_over_without": kv["mla"] / kv["without_mla"],
        },
    }


def print_mla_table(r: dict[str, Any]) -> None:
    tps, kv, ratios = r["tokens_per_s"], r["kv_bytes_per_token"], r["ratios"]
    runs = " / ".join(f"{x:.1f}" for x in tps["mla_runs"])
    rows = [
        ("MLA vs same-size without MLA", f"{r['requests']} requests, {r['output_tokens']} output tokens", ""),
        ("MLA: output tokens/s", f"{tps['mla']:.1f}", f"runs before/after: {runs}"),
        ("without MLA: output tokens/s", f"{tps['without_mla']:.1f}", ""),
        ("tokens/s MLA / without", f"{ratios['tokens_per_s_mla_over_without']:.2f}x", ""),
        ("KV bytes/token MLA", f"{kv['mla']}", f"{r['kv_bytes_per_token_per_layer']['mla']} per layer"),
        (
            "KV bytes/token without MLA",
            f"{kv['without_mla']}",
            f"{r['kv_bytes_per_token_per_layer']['without_mla']} per layer",
        ),
        ("KV bytes/token MLA / without", f"{ratios['kv_bytes_per_token_mla_over_without']:.3f}", ""),
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    print()
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())
