"""GGUF files of the tiny sliding-window checkpoints (``tests.support.sliding_models``),
written as llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/gemma.py``)
lays them out:

- Gemma 2 and 3: every ``*norm.weight`` stored with the ``+ 1`` of Gemma's ``(1 + w)``
  already added; ``attention.key_length`` (head_dim), ``attention.sliding_window``,
  Gemma 2's ``attn_logit_softcapping`` and ``final_logit_softcapping``, Gemma 3's
  ``rope.freq_base`` of its full layers (and their linear ``rope.scaling.*``),
  ``rope.freq_base_swa`` of its sliding ones and ``final_logit_softcapping`` when set, and
  each layer's sliding flag as ``attention.sliding_window_pattern`` (llama.cpp's
  ``load_swa_pattern`` reads the array);
- 2-D weights quantized to the requested type, norms and other tensors F32, SmolLM2's
  tokenizer fields copied (``tests.support.gguf_families``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFWriter,
    RopeScalingType,
    get_tensor_name_map,
    quantize,
)
from safetensors.torch import load_file

from tests.support.gguf_families import copy_tokenizer, finish_file, shared_metadata

GGUF_ARCH = {"gemma2": "gemma2", "gemma3": "gemma3"}


def _gemma_metadata(writer: GGUFWriter, family: str, config: Any) -> None:
    shared_metadata(writer, config, config.head_dim)
    writer.add_sliding_window(config.sliding_window)
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
    rope = config.rope_parameters
    if family == "gemma2":
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    else:
        full = rope["full_attention"]
        writer.add_rope_freq_base(full["rope_theta"])
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        if full.get("rope_type") == "linear":
            writer.add_rope_scaling_type(RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full["factor"])
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)


def write_sliding_gguf(model_dir: Path, out: Path, family: str, qtype: GGMLQuantizationType) -> Path:
    """``model_dir`` (``make_sliding_model_dir`` of ``family``) as llama.cpp's GGUF."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    gguf_arch = GGUF_ARCH[family]
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == gguf_arch)
    assert isinstance(arch, MODEL_ARCH)
    name_map = get_tensor_name_map(arch, config.num_hidden_layers)
    writer = GGUFWriter(str(out), gguf_arch)
    writer.add_name(model_dir.name)
    _gemma_metadata(writer, family, config)
    copy_tokenizer(writer)
    for hf_name, tensor in load_file(model_dir / "model.safetensors").items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = name_map.get_name(base)
        if gguf_base is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        data = tensor.float().numpy()
        if hf_name.endswith("norm.weight"):
            data = data + np.float32(1)
        if data.ndim == 2 and data.shape[-1] % 32 == 0:
            writer.add_tensor(f"{gguf_base}.{suffix}", quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(f"{gguf_base}.{suffix}", np.ascontiguousarray(data, dtype=np.float32))
    finish_file(writer)
    return out


def gguf_mxfp4_from_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss's safetensors MXFP4 (``blocks`` ``[..., G, 16]``: byte ``j`` holds elements
    ``2j`` low and ``2j + 1`` high; ``scales`` ``[..., G]``) -> ggml's ``block_mxfp4``
    bytes ``[..., G * 17]``: the E8M0 scale, then 16 bytes, byte ``j`` holding elements
    ``j`` (low nibble) and ``j + 16`` (high), as llama.cpp's converter repacks them."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = (codes[..., :16] | (codes[..., 16:] << 4)).astype(np.uint8)
    out = np.concatenate([scales[..., None].astype(np.uint8), packed], axis=-1)
    return out.reshape(*blocks.shape[:-2], -1)


def _gpt_oss_metadata(writer: GGUFWriter, config: Any) -> None:
    shared_metadata(writer, config, config.head_dim)
    writer.add_expert_feed_forward_length(config.intermediate_size)
    writer.add_expert_count(config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_sliding_window(config.sliding_window)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def _gpt_oss_tensors(state: dict[str, Any]) -> dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]:
    """HF-named gpt-oss tensors -> llama.cpp's: ``gate_up`` split into its interleaved gate
    (even rows) and up (odd rows), MXFP4 experts repacked, sinks and the router renamed."""
    out: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]] = {}
    mxfp4 = GGMLQuantizationType.MXFP4
    for name, tensor in state.items():
        prefix, _, leaf = name.rpartition("mlp.experts.")
        if leaf == "gate_up_proj_blocks":
            blocks, scales = tensor.numpy(), state[f"{prefix}mlp.experts.gate_up_proj_scales"].numpy()
            out[f"{prefix}mlp.experts.gate_proj.weight"] = (
                gguf_mxfp4_from_blocks(blocks[:, ::2], scales[:, ::2]),
                mxfp4,
            )
            out[f"{prefix}mlp.experts.up_proj.weight"] = (
                gguf_mxfp4_from_blocks(blocks[:, 1::2], scales[:, 1::2]),
                mxfp4,
            )
        elif leaf == "down_proj_blocks":
            scales = state[f"{prefix}mlp.experts.down_proj_scales"].numpy()
            out[f"{prefix}mlp.experts.down_proj.weight"] = (
                gguf_mxfp4_from_blocks(tensor.numpy(), scales),
                mxfp4,
            )
        elif leaf == "gate_up_proj_bias":
            out[f"{prefix}mlp.experts.gate_proj.bias"] = (tensor[..., ::2].float().numpy(), None)
            out[f"{prefix}mlp.experts.up_proj.bias"] = (tensor[..., 1::2].float().numpy(), None)
        elif leaf == "down_proj_bias":
            out[f"{prefix}mlp.experts.down_proj.bias"] = (tensor.float().numpy(), None)
        elif not leaf.endswith("_scales"):
            out[name + ".weight" if name.endswith("sinks") else name] = (tensor.float().numpy(), None)
    return out


def write_gpt_oss_gguf(model_dir: Path, out: Path, qtype: GGMLQuantizationType) -> Path:
    """A gpt-oss ``make_sliding_model_dir`` (MXFP4 experts) as llama.cpp's GGUF: experts
    MXFP4 (the same values), other 2-D weights in ``qtype``, the rest F32."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    name_map = get_tensor_name_map(MODEL_ARCH.GPT_OSS, config.num_hidden_layers)
    writer = GGUFWriter(str(out), MODEL_ARCH_NAMES[MODEL_ARCH.GPT_OSS])
    writer.add_name(model_dir.name)
    _gpt_oss_metadata(writer, config)
    copy_tokenizer(writer)
    for hf_name, (data, raw) in _gpt_oss_tensors(load_file(model_dir / "model.safetensors")).items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = name_map.get_name(base)
        if gguf_base is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        if raw is not None:
            writer.add_tensor(f"{gguf_base}.{suffix}", data, raw_dtype=raw)
        elif (
            qtype != GGMLQuantizationType.F32
            and suffix == "weight"
            and data.ndim == 2
            and data.shape[-1] % 32 == 0
            and not base.endswith("router")
        ):
            writer.add_tensor(f"{gguf_base}.{suffix}", quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(f"{gguf_base}.{suffix}", np.ascontiguousarray(data, dtype=np.float32))
    finish_file(writer)
    return out
