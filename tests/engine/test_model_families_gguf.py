"""GGUF files of the families transformers' GGUF reader maps (qwen3, qwen3moe, phi3),
written as llama.cpp lays them out, load through our quantized CPU path (blocks kept
for the kernels, fused Phi-3 projections split as blocks, expert stacks joined) and
decode the same greedy tokens as transformers on the GGUF's de-quantized weights."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
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


def q5_k_spec(raw: np.ndarray) -> np.ndarray:
    """Q5_K de-quantized as ggml's ``dequantize_row_q5_K`` spells it, block by block:
    ``block_q5_K = {f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]}``; each 64
    values take two 6-bit (scale, min) pairs (``get_scale_min_k4``), the low and high
    nibbles of 32 ``qs`` bytes, and the fifth bit from ``qh`` (bits ``2i`` and ``2i+1``
    for the i-th 64)."""
    blocks = raw.reshape(-1, 176)
    out = np.empty((blocks.shape[0], 256), dtype=np.float32)

    def scale_min(j: int, q: np.ndarray) -> tuple[int, int]:
        if j < 4:
            return int(q[j] & 63), int(q[j + 4] & 63)
        return int((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)), int((q[j + 4] >> 4) | ((q[j] >> 6) << 4))

    for b, block in enumerate(blocks):
        d = float(block[0:2].view(np.float16)[0])
        dmin = float(block[2:4].view(np.float16)[0])
        scales, qh, qs = block[4:16], block[16:48].astype(np.int32), block[48:176].astype(np.int32)
        for i in range(4):
            ql = qs[32 * i : 32 * i + 32]
            for half, (nibble, bit) in enumerate(((ql & 0xF, 1 << (2 * i)), (ql >> 4, 2 << (2 * i)))):
                sc, m = scale_min(2 * i + half, scales)
                q = nibble + np.where(qh & bit, 16, 0)
                start = 64 * i + 32 * half
                out[b, start : start + 32] = np.float32(d * sc) * q - np.float32(dmin * m)
    return out.reshape(-1)


def test_gguf_q5_k_weights_are_the_format_specs_values(tmp_path: Path) -> None:
    """A Q5_K GGUF (rows of 256) loads each projection as ggml's block layout defines it
    (within fp32 rounding of the two products), and decodes transformers' tokens."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    model_dir = make_family_model_dir(
        tmp_path / "qwen3", "qwen3", seed=2, hidden_size=256, intermediate_size=512, head_dim=64
    )
    gguf = write_family_gguf(model_dir, tmp_path / "qwen3-q5_k.gguf", "qwen3", GGMLQuantizationType.Q5_K)
    raw = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    assert raw["blk.0.attn_q.weight"].tensor_type == GGMLQuantizationType.Q5_K
    cache = tmp_path / "cache"
    model, _, _ = load_model(gguf, device="cpu", weights_cache_dir=cache)
    layer = model.model.layers[0]
    for gguf_name, weight in (
        ("blk.0.attn_q.weight", layer.self_attn.q_proj.weight),
        ("blk.0.attn_v.weight", layer.self_attn.v_proj.weight),
        ("blk.0.ffn_down.weight", layer.mlp.down_proj.weight),
        ("blk.1.ffn_gate.weight", model.model.layers[1].mlp.gate_proj.weight),
    ):
        expected = torch.from_numpy(q5_k_spec(np.asarray(raw[gguf_name].data))).view(weight.shape)
        torch.testing.assert_close(weight.detach(), expected, rtol=1e-6, atol=1e-7)

    hf = AutoModelForCausalLM.from_pretrained(ensure_gguf_converted(gguf, cache), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    model.prepare_cpu_kernels()
    prompt = [random.Random(5).randrange(100, 40000) for _ in range(30)]
    with torch.no_grad():
        expected_tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[
            0, 30:
        ].tolist()
    assert greedy_generate(model, [prompt], max_new_tokens=8) == [expected_tokens]
