"""GGUF weights kept quantized: each weight held once, names and row order as
transformers' GGUF loader gives them, unsupported types de-quantized, bad files refused.

Greedy exactness on the default (quantized) GGUF is checked by the SmolLM2 tests
(``test_engine_smollm2.py``: 8 prompts against HF generate on the same file)."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, dequantize, quantize

from benchmarks.bench_single_stream import held_tensors
from chatsite_kernels.cpu.quant import QuantRows
from inference.runner.gguf.weights import GGUFFormatError, build_index, read_gguf_weights
from inference.runner.model_loader import load_model
from tests.support.fakes import make_tiny_model_dir


@pytest.mark.slow
def test_default_model_holds_no_fp32_copy_of_a_quantized_weight(smollm2_pair) -> None:
    model, config = smollm2_pair.ours, smollm2_pair.config
    h, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    linear_sizes = {h * q, h * kv, q * h, h * inter, vocab * h, h * (q + 2 * kv), 2 * h * inter}
    tensors = held_tensors(model)
    fp32 = [t for t in tensors if t.dtype == torch.float32]
    assert not [tuple(t.shape) for t in fp32 if t.numel() in linear_sizes]
    # What is left in fp32: the norms and the rotary table.
    assert all(t.dim() == 1 or tuple(t.shape) == tuple(model.cos_sin_cache.shape) for t in fp32)
    quant = [t for t in tensors if t.dtype == torch.uint8]
    # Per layer: q/k/v fused, o, gate/up fused, down; and one vocabulary for embedding and LM head.
    assert len(quant) == 4 * config.num_layers + 1
    weights = config.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * inter) + vocab * h
    quant_bytes = sum(t.numel() for t in quant)
    assert quant_bytes < 0.9 * weights  # under a byte per weight: blocks, not floats
    embed = model.model.embed_tokens
    assert embed.weight is None and model.lm_head.weight is None and embed.quant is model.lm_head.quant


def test_fp32_directory_model_drops_its_unpacked_weights_at_engine_start(tmp_path: Path) -> None:
    model, _, config = load_model(make_tiny_model_dir(tmp_path / "llama", arch="llama"), device="cpu")
    ids = torch.tensor([5, 17, 300])
    before_embed = model.model.embed_tokens(ids)
    x = torch.randn(3, config.hidden_size)
    with torch.inference_mode():
        before = [
            model.compute_logits(x),
            model.model.layers[0].mlp(x),
            model.model.layers[0].self_attn.o_proj(x),
        ]
    weights_before = sum(t.numel() for t in held_tensors(model))
    model.prepare_cpu_kernels()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight is None for m in linears)
    assert model.model.embed_tokens.weight is None  # tied: read from the LM head's panels
    assert sum(t.numel() for t in held_tensors(model)) < 1.1 * weights_before  # packed replaces, not adds
    with torch.inference_mode():
        after = [
            model.compute_logits(x),
            model.model.layers[0].mlp(x),
            model.model.layers[0].self_attn.o_proj(x),
        ]
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(model.model.embed_tokens(ids), before_embed)


def write_llama_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]]) -> None:
    writer = GGUFWriter(str(path), "llama")
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class Config:
    """The two fields transformers' Llama tensor processor reads."""

    def to_dict(self) -> dict[str, int]:
        return {"num_attention_heads": 4, "num_key_value_heads": 2}


def test_names_permutation_and_fallback_match_transformers(tmp_path: Path, caplog) -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(0)
    tensors = {
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)).astype(np.float32), GGMLQuantizationType.Q8_0),
        "blk.0.attn_k.weight": (rng.standard_normal((32, 64)).astype(np.float32), GGMLQuantizationType.Q4_1),
        "blk.0.ffn_up.weight": (rng.standard_normal((48, 64)).astype(np.float32), GGMLQuantizationType.Q5_0),
        "blk.0.attn_norm.weight": (rng.standard_normal(64).astype(np.float32), GGMLQuantizationType.F32),
    }
    path = tmp_path / "small.gguf"
    write_llama_gguf(path, tensors)
    names = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.input_layernorm.weight",
    ]
    with caplog.at_level(logging.INFO, logger="inference.runner.gguf.weights"):
        out = read_gguf_weights(path, build_index(path, names), Config())
    assert sum("Q5_0" in r.message for r in caplog.records) == 1
    processor = LlamaTensorProcessor(config=Config().to_dict())
    for (gguf_name, (data, qtype)), hf_name in zip(tensors.items(), names, strict=True):
        expected = dequantize(quantize(data, qtype), qtype).reshape(data.shape)
        expected = torch.from_numpy(np.array(processor.process(weights=expected, name=gguf_name).weights))
        got = out[hf_name]
        assert isinstance(got, QuantRows) == (qtype in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1))
        assert torch.equal(got.dequantize() if isinstance(got, QuantRows) else got, expected), hf_name


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_refused_by_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "bad.gguf"
    write_llama_gguf(
        path,
        {
            "blk.0.attn_q.weight": (
                rng.standard_normal((64, 64)).astype(np.float32),
                GGMLQuantizationType.Q8_0,
            ),
            "blk.0.attn_k.weight": (
                rng.standard_normal((32, 64)).astype(np.float32),
                GGMLQuantizationType.Q4_0,
            ),
        },
    )
    blob = bytearray(path.read_bytes())
    # Tensor info: name, n_dims (u32), dims (u64 each). Claim 80 rows where 64 were written.
    name = b"blk.0.attn_q.weight"
    dims_at = blob.index(name) + len(name) + 4
    assert struct.unpack_from("<QQ", blob, dims_at) == (64, 64)
    struct.pack_into("<Q", blob, dims_at + 8, 80)
    path.write_bytes(bytes(blob))
    with pytest.raises(GGUFFormatError, match="blk.0.attn_q.weight"):
        build_index(
            path, ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]
        )
