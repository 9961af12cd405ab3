"""gpt-oss GGUF files (llama.cpp's ``gpt-oss`` architecture) read without transformers'
GGUF config reader, which fails on their ``rope.scaling.*`` keys (it converts a key's
length field, not its value), and whose tensor processor expects expert names llama.cpp
does not write.

- The config: a ``GptOssConfig`` from the keys llama.cpp's loader reads
  (``src/models/openai-moe.cpp``): sliding layers every other one from layer 0 (or as
  ``attention.sliding_window_pattern`` says), YaRN from ``rope.scaling.*`` with gpt-oss's
  ``beta_fast`` 32, ``beta_slow`` 1 and no truncation, the expert width
  ``expert_feed_forward_length``.
- The tensors: llama.cpp splits HF's interleaved ``gate_up_proj`` ``[E, H, 2I]`` into
  ``ffn_gate_exps`` (even columns) and ``ffn_up_exps`` (odd), each ``[E, I, H]``, stores
  ``ffn_down_exps`` ``[E, H, I]`` and the sinks as ``attn_sinks.weight``. Experts come as
  MXFP4 (ggml type 39), de-quantized at load by ``inference.runner.mxfp4.dequantize_gguf``
  as the safetensors path does it; ``to_hf_layout`` puts everything back in HF's layout.
"""

from __future__ import annotations

import re
from typing import Any

import torch

ARCHITECTURE = "gpt-oss"
_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)(_bias)?$")
_SINKS = re.compile(r"^model\.layers\.\d+\.self_attn\.sinks$")


def gpt_oss_config(fields: dict[str, Any]) -> Any:
    """``fields``: the GGUF's keys -> values (``GGUFReader`` field contents)."""
    from transformers import GptOssConfig

    def key(name: str, default: Any = None) -> Any:
        return fields.get(f"{ARCHITECTURE}.{name}", default)

    layers = int(key("block_count"))
    pattern = key("attention.sliding_window_pattern")
    sliding = [bool(f) for f in pattern] if isinstance(pattern, list) else [i % 2 == 0 for i in range(layers)]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 150000.0))}
    if key("rope.scaling.type") == "yarn":
        rope.update(
            rope_type="yarn",
            factor=float(key("rope.scaling.factor")),
            original_max_position_embeddings=int(key("rope.scaling.original_context_length")),
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
        )
    config = GptOssConfig(
        vocab_size=int(key("vocab_size", len(fields["tokenizer.ggml.tokens"]))),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("expert_feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=int(key("attention.head_count")),
        num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        num_local_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        sliding_window=int(key("attention.sliding_window")),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=fields.get("tokenizer.ggml.padding_token_id"),
    )
    config.architectures = ["GptOssForCausalLM"]
    return config


def index_names(hf_names: list[str]) -> list[str]:
    """HF parameter names -> the names ``build_index`` maps onto llama.cpp's tensors."""
    out = []
    for name in hf_names:
        if m := _EXPERTS.match(name):
            kind = "bias" if m[3] else "weight"
            projections = ("gate", "up") if m[2] == "gate_up_proj" else ("down",)
            out += [f"{m[1]}{p}_proj.{kind}" for p in projections]
        elif _SINKS.match(name):
            out.append(name + ".weight")
        else:
            out.append(name)
    return out


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.stack((gate, up), dim=-1).flatten(-2)


def to_hf_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``index_names``-named tensors (GGUF shapes, reversed to row-major) -> HF's."""
    out = {}
    for name, value in tensors.items():
        prefix, _, leaf = name.rpartition("mlp.experts.")
        if leaf == "gate_proj.weight":
            up = tensors[f"{prefix}mlp.experts.up_proj.weight"]
            gate_up = _interleave(value.transpose(-1, -2), up.transpose(-1, -2))
            out[f"{prefix}mlp.experts.gate_up_proj"] = gate_up.contiguous()
        elif leaf == "gate_proj.bias":
            out[f"{prefix}mlp.experts.gate_up_proj_bias"] = _interleave(
                value, tensors[f"{prefix}mlp.experts.up_proj.bias"]
            )
        elif leaf == "down_proj.weight":
            out[f"{prefix}mlp.experts.down_proj"] = value.transpose(-1, -2).contiguous()
        elif leaf == "down_proj.bias":
            out[f"{prefix}mlp.experts.down_proj_bias"] = value
        elif leaf.startswith("up_proj."):
            continue
        else:
            out[name.removesuffix(".weight") if name.endswith("sinks.weight") else name] = value
    return out
