"""Config readers of the hybrid linear-attention families: Qwen3-Next, Qwen3.5 and
Qwen3.5-MoE (text).

Three Gated DeltaNet layers for every full-attention layer (``layer_types``); the full
layers are gated attention with a (1 + w) RMSNorm of each head's q and k and partial
rotary. Qwen3-Next's MLP is routed experts plus a gated shared expert; Qwen3.5's is dense, Qwen3.5-MoE's is Qwen3-Next's on every layer.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from inference.errors import UnsupportedModelError
from inference.model_config import GatedDeltaNetConfig, ModelConfig, MoEConfig
from inference.models.config_readers import read_llama

_LAYER_TYPES = ("linear_attention", "full_attention")


def _linear_attention(config: Any, architecture: str, fused: bool) -> GatedDeltaNetConfig:
    layer_types = tuple(config.layer_types)
    if len(layer_types) != config.num_hidden_layers or any(t not in _LAYER_TYPES for t in layer_types):
        raise UnsupportedModelError(architecture, f"layer_types {layer_types!r} (supported: {_LAYER_TYPES})")
    num_k, num_v = config.linear_num_key_heads, config.linear_num_value_heads
    if num_v % num_k:
        raise UnsupportedModelError(
            architecture, f"linear_num_value_heads {num_v} is not a multiple of linear_num_key_heads {num_k}"
        )
    return GatedDeltaNetConfig(
        layer_types=layer_types,
        num_k_heads=num_k,
        num_v_heads=num_v,
        head_k_dim=config.linear_key_head_dim,
        head_v_dim=config.linear_value_head_dim,
        conv_kernel=config.linear_conv_kernel_dim,
        fused_projections=fused,
        shared_expert_intermediate_size=int(getattr(config, "shared_expert_intermediate_size", 0) or 0),
    )


def _moe(config: Any, *, always_normalised: bool = False) -> MoEConfig:
    return MoEConfig(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        num_groups=1,
        topk_groups=1,
        norm_topk_prob=always_normalised or bool(config.norm_topk_prob),
        routed_scaling_factor=1.0,
        num_shared_experts=0,  # the gated shared expert is the model's own (``linear_attention``)
        intermediate_size=config.moe_intermediate_size,
        first_dense_layers=0,
        scoring="softmax",
        sparse_step=max(1, int(getattr(config, "decoder_sparse_step", 1) or 1)),
        dense_layers=tuple(getattr(config, "mlp_only_layers", None) or ()),
    )


def read_qwen3_next(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3-Next: fused per-key-head projections of the linear layers; routed experts
    (softmax router, top-k) plus a sigmoid-gated shared expert on every
    ``decoder_sparse_step``-th layer not in ``mlp_only_layers``. The multi-token-prediction
    head (``mtp.*`` weights) is not served."""
    base = read_llama(config, architecture, name, partial_rotary=True)
    moe = _moe(config) if config.num_experts else None
    return dataclasses.replace(
        base, moe=moe, linear_attention=_linear_attention(config, architecture, fused=True)
    )


def read_qwen3_5(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3.5 (text): separate projections of the linear layers and a dense MLP. Its
    multimodal rotary (``mrope_section``) turns text positions exactly as plain rotary."""
    base = read_llama(config, architecture, name, partial_rotary=True)
    return dataclasses.replace(base, linear_attention=_linear_attention(config, architecture, fused=False))


def read_qwen3_5_moe(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3.5-MoE (text): Qwen3.5's layers with Qwen3-Next's MLP on every layer (routed
    experts, top-k always renormalised, plus the gated shared expert); its config has no
    dense ``intermediate_size``, so the experts' is recorded there."""
    if not hasattr(config, "intermediate_size"):
        config = copy.copy(config)
        config.intermediate_size = config.moe_intermediate_size
    base = read_qwen3_5(config, architecture, name)
    return dataclasses.replace(base, moe=_moe(config, always_normalised=True))


def read_qwen3_5_vision_language(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3.5 and Qwen3.5-MoE as released (``*ForConditionalGeneration``): the text model
    of ``text_config``, served on text alone (the loader leaves the vision tower out)."""
    text = copy.copy(config.text_config)
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    if getattr(text, "eos_token_id", None) is None:
        text.eos_token_id = getattr(config, "eos_token_id", None)
    read = read_qwen3_5_moe if getattr(text, "num_experts", 0) else read_qwen3_5
    return read(text, architecture, name or getattr(config, "name_or_path", ""))
