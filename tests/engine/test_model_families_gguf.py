"""GGUF files of the families transformers' GGUF reader maps (qwen3, qwen3moe, phi3),
written as llama.cpp lays them out, load through our quantized CPU path (blocks kept
for the kernels, fused Phi-3 projections split as blocks, expert stacks joined) and
decode the same greedy tokens as transformers on the GGUF's de-quantized weights."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from chatsite_kernels.cpu import quant as cpu_quant
from inference.runner.model_loader import ensure_gguf_converted, load_model
from tests.support.fakes import greedy_generate
from tests.support.families import make_family_model_dir
from tests.support.gguf_families import write_family_gguf

CASES = [
    pytest.param("qwen3", "qwen3", GGMLQuantizationType.Q4_0, {}, id="qwen3-q4_0"),
    # llama.cpp's qwen3moe has no dense layers between the sparse ones.
    pytest.param(
        "qwen3_moe", "qwen3moe", GGMLQuantizationType.Q8_0, {"mlp_only_layers": []}, id="qwen3moe-q8_0"
    ),
    pytest.param("phi3", "phi3", GGMLQuantizationType.Q8_0, {}, id="phi3-q8_0"),  # partial rotary, LongRoPE
]


@pytest.mark.skipif(not cpu_quant.available(), reason="the quantized CPU kernels need gcc")
@pytest.mark.parametrize(("family", "gguf_arch", "qtype", "overrides"), CASES)
def test_gguf_family_quantized_matches_transformers(
    tmp_path: Path, family: str, gguf_arch: str, qtype: GGMLQuantizationType, overrides: dict
) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_family_model_dir(tmp_path / family, family, seed=1, **overrides)
    gguf = write_family_gguf(model_dir, tmp_path / f"{family}.gguf", gguf_arch, qtype)
    cache = tmp_path / "cache"
    hf = AutoModelForCausalLM.from_pretrained(ensure_gguf_converted(gguf, cache), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0

    model, _, config = load_model(gguf, device="cpu", weights_cache_dir=cache)
    assert config.architecture == type(hf).__name__
    assert model.model.layers[0].self_attn._qkv_quant is not None  # q/k/v kept as blocks
    model.prepare_cpu_kernels()
    rng = random.Random(family)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 37, 200)]
    ours = greedy_generate(model, prompts, max_new_tokens=8)
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    assert ours == expected
