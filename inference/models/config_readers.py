"""Config readers: a transformers ``PretrainedConfig`` to our ``ModelConfig``, one per
architecture family (the registry pairs each architecture with its reader).

A reader pins down exactly which features of the family we implement: anything else
is refused with ``UnsupportedModelError`` before a weight is read, rather than run
with wrong logits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from inference.errors import UnsupportedModelError
from inference.model_config import (
    DEEPSEEK_ROPE_TYPES,
    SUPPORTED_ROPE_TYPES,
    MLAConfig,
    ModelConfig,
    MoEConfig,
    partial_rotary_factor,
    rope_of,
    yarn_get_mscale,
)


def _eos_ids(config: Any) -> list[int]:
    eos = config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def shared_fields(config: Any, architecture: str, name: str) -> dict[str, Any]:
    """The ``ModelConfig`` fields every family reads the same way from its config."""
    return {
        "architecture": architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": config.num_attention_heads,
        "rms_norm_eps": float(config.rms_norm_eps),
        "max_position_embeddings": config.max_position_embeddings,
        "eos_token_ids": _eos_ids(config),
        "bos_token_id": getattr(config, "bos_token_id", None),
        "name": name or getattr(config, "name_or_path", "") or architecture,
    }


def _check_silu(config: Any, architecture: str) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(architecture, f"hidden_act {act!r} (only silu)")


def _refuse_sliding(config: Any, architecture: str) -> None:
    """Families whose configs may switch a sliding window on: we attend fully, so refuse it."""
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise UnsupportedModelError(
            architecture, "use_sliding_window (this family is served with full attention)"
        )


def read_llama(
    config: Any,
    architecture: str,
    name: str,
    rope_types: tuple[str, ...] = SUPPORTED_ROPE_TYPES,
    *,
    partial_rotary: bool = False,
) -> ModelConfig:
    """Llama, Mistral and Qwen2, and the common part of every family that shares their
    decoder (the family readers below start from it)."""
    _check_silu(config, architecture)
    rope_theta, rope_scaling = rope_of(config, architecture, rope_types)
    partial = partial_rotary_factor(config)
    if not partial_rotary and not math.isclose(partial, 1.0):
        raise UnsupportedModelError(architecture, f"partial_rotary_factor {partial}")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    llama_bias = bool(getattr(config, "attention_bias", False)) and not is_qwen2
    sliding = getattr(config, "sliding_window", None)
    if is_qwen2 and not getattr(config, "use_sliding_window", False):
        sliding = None  # Qwen2 configs carry a window they do not use
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or rotary_dim < 2:
        raise UnsupportedModelError(architecture, f"partial_rotary_factor {partial} of head_dim {head_dim}")
    return ModelConfig(
        **shared_fields(config, architecture, name),
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        partial_rotary_dim=rotary_dim if rotary_dim != head_dim else None,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=is_qwen2 or llama_bias,
        attention_out_bias=llama_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        sliding_window=sliding,
    )


def read_deepseek_v3(config: Any, architecture: str, name: str) -> ModelConfig:
    """DeepSeek-V3: MLA + MoE. Features of the reference implementation we do not have
    (other routers, quantised checkpoints, MoE every n-th layer) are refused by name."""
    _check_silu(config, architecture)

    def refuse(detail: str) -> UnsupportedModelError:
        return UnsupportedModelError(architecture, detail)

    # Keys HF's config class does not declare (DeepSeek's own config.json has them) are
    # kept as attributes; each must have the value our implementation assumes.
    expected = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1}
    for key, value in expected.items():
        found = getattr(config, key, value)
        if found != value:
            raise refuse(f"{key} {found!r} (supported: {value!r})")
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else type(quant).__name__
        raise refuse(f"quantization_config {method!r} (de-quantise the checkpoint to bf16/fp32 first)")
    num_experts, groups = config.n_routed_experts, config.n_group or 1
    topk_groups = config.topk_group or groups
    if num_experts % groups or not 1 <= topk_groups <= groups:
        raise refuse(f"n_group {groups} / topk_group {topk_groups} for {num_experts} experts")
    if config.num_experts_per_tok > topk_groups * (num_experts // groups):
        raise refuse(
            f"num_experts_per_tok {config.num_experts_per_tok} exceeds the experts of topk_group groups"
        )

    theta, scaling = rope_of(config, architecture, DEEPSEEK_ROPE_TYPES)
    qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    softmax_scale = qk_head_dim**-0.5
    if scaling is not None:  # YaRN (the only non-default type we accept here)
        if scaling.get("factor") is None:
            raise refuse("rope_scaling yarn without 'factor'")
        mscale_all_dim = scaling.get("mscale_all_dim") or 0
        if mscale_all_dim:
            mscale = yarn_get_mscale(scaling["factor"], mscale_all_dim)
            softmax_scale *= mscale * mscale
    num_heads = config.num_attention_heads
    return ModelConfig(
        **shared_fields(config, architecture, name),
        num_kv_heads=num_heads,  # after kv_b_proj every head has its own K and V
        head_dim=qk_head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        mla=MLAConfig(
            q_lora_rank=config.q_lora_rank,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            softmax_scale=softmax_scale,
            rope_interleave=bool(getattr(config, "rope_interleave", True)),
        ),
        moe=MoEConfig(
            num_experts=num_experts,
            top_k=config.num_experts_per_tok,
            num_groups=groups,
            topk_groups=topk_groups,
            norm_topk_prob=bool(config.norm_topk_prob),
            routed_scaling_factor=float(config.routed_scaling_factor),
            num_shared_experts=config.n_shared_experts or 0,
            intermediate_size=config.moe_intermediate_size,
            first_dense_layers=config.first_k_dense_replace or 0,
        ),
    )


def read_qwen3(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3: Llama plus an RMSNorm of each head's q and k before rotary, and an
    explicit ``head_dim`` (not hidden / heads)."""
    _refuse_sliding(config, architecture)
    return dataclasses.replace(read_llama(config, architecture, name), qk_norm="head")


def read_qwen3_moe(config: Any, architecture: str, name: str) -> ModelConfig:
    """Qwen3-MoE: Qwen3's attention; routed experts (softmax router, top-k, renormalised
    with ``norm_topk_prob``, no shared expert) on every ``decoder_sparse_step``-th layer
    not in ``mlp_only_layers``, a dense MLP of ``intermediate_size`` on the others."""
    _refuse_sliding(config, architecture)
    base = read_qwen3(config, architecture, name)
    if not config.num_experts:
        return base
    moe = MoEConfig(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        num_groups=1,
        topk_groups=1,
        norm_topk_prob=bool(config.norm_topk_prob),
        routed_scaling_factor=1.0,
        num_shared_experts=0,
        intermediate_size=config.moe_intermediate_size,
        first_dense_layers=0,
        scoring="softmax",
        sparse_step=max(1, int(getattr(config, "decoder_sparse_step", 1) or 1)),
        dense_layers=tuple(getattr(config, "mlp_only_layers", None) or ()),
    )
    return dataclasses.replace(base, moe=moe)


def read_phi3(config: Any, architecture: str, name: str) -> ModelConfig:
    """Phi-3 / Phi-4: Llama with fused ``qkv_proj`` and ``gate_up_proj`` (split at load,
    ``inference.layers.fused_weights``), partial rotary and LongRoPE scaling."""
    base = read_llama(config, architecture, name, (*SUPPORTED_ROPE_TYPES, "longrope"), partial_rotary=True)
    scaling = base.rope_scaling
    if scaling is not None and scaling["rope_type"] == "longrope":
        scaling = dict(scaling)
        original = scaling.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if not original:
            raise UnsupportedModelError(architecture, "longrope without original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = int(original)
        half = base.rotary_dim // 2
        for key in ("short_factor", "long_factor"):
            if len(scaling.get(key) or ()) != half:
                raise UnsupportedModelError(architecture, f"longrope {key} must have {half} values")
        base = dataclasses.replace(base, rope_scaling=scaling)
    return base


def read_olmo2(config: Any, architecture: str, name: str) -> ModelConfig:
    """OLMo 2: RMSNorm after attention and after the MLP (none before), and q/k RMSNorm
    over the whole projection (all heads together)."""
    return dataclasses.replace(read_llama(config, architecture, name), qk_norm="full", post_norms=True)


def read_granite(config: Any, architecture: str, name: str) -> ModelConfig:
    """Granite 3: Llama with embedding, attention (the softmax scale) and residual
    multipliers, and logits divided by ``logits_scaling``."""
    return dataclasses.replace(
        read_llama(config, architecture, name),
        embedding_multiplier=float(config.embedding_multiplier),
        attention_multiplier=float(config.attention_multiplier),
        residual_multiplier=float(config.residual_multiplier),
        logits_scaling=float(config.logits_scaling),
    )


def read_smollm3(config: Any, architecture: str, name: str) -> ModelConfig:
    """SmolLM3: Llama where the layers marked 0 in ``no_rope_layers`` (every fourth by
    default) use no rotary embedding at all."""
    _refuse_sliding(config, architecture)
    flags = list(getattr(config, "no_rope_layers", None) or [])
    if flags and len(flags) != config.num_hidden_layers:
        raise UnsupportedModelError(architecture, f"no_rope_layers has {len(flags)} entries")
    return dataclasses.replace(
        read_llama(config, architecture, name), rope_layers=tuple(bool(f) for f in flags)
    )
