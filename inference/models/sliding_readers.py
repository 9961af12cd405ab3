"""Config readers of the sliding-window families: Gemma 2, Gemma 3 (text) and gpt-oss
(the ``read_config`` of their rows in ``inference.models.registry``)."""

from __future__ import annotations

from typing import Any

from inference.errors import UnsupportedModelError
from inference.model_config import GemmaConfig, GptOssConfig, ModelConfig, rope_of
from inference.models.config_readers import shared_fields


def read_gemma(config: Any, architecture: str, name: str) -> ModelConfig:
    """Gemma 2 and Gemma 3 (text): GELU-tanh MLP, (1 + w) norms, sliding and full layers
    (``layer_types``); Gemma 3's two rotary bases come per layer type in transformers 5
    (``rope_parameters[layer_type]``), as ``rope_local_base_freq`` before."""
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModelError(architecture, f"hidden_activation {act!r} (only gelu_pytorch_tanh)")
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(architecture, "use_bidirectional_attention (an encoder, not a decoder)")
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:
        full, local = params["full_attention"], params.get("sliding_attention") or params["full_attention"]
        rope_theta, local_theta = float(full["rope_theta"]), float(local["rope_theta"])
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModelError(architecture, f"sliding layers' rope type {local['rope_type']!r}")
        scaling = {**full}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise UnsupportedModelError(architecture, f"rope type {rope_type!r} (supported: default, linear)")
        rope_scaling = (
            None if rope_type == "default" else {"rope_type": "linear", "factor": scaling["factor"]}
        )
    else:
        rope_theta, rope_scaling = rope_of(config, architecture, ("default", "linear"))
        local_theta = float(getattr(config, "rope_local_base_freq", None) or rope_theta)
    gemma3 = architecture == "Gemma3ForCausalLM"
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    return ModelConfig(
        **shared_fields(config, architecture, name),
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        attention_out_bias=bool(getattr(config, "attention_bias", False)),
        sliding_window=getattr(config, "sliding_window", None),
        layer_types=layer_types or ("full_attention",) * config.num_hidden_layers,
        gemma=GemmaConfig(
            query_pre_attn_scalar=float(config.query_pre_attn_scalar),
            local_rope_theta=local_theta if gemma3 else rope_theta,
            qk_norm=gemma3,
            attn_softcap=getattr(config, "attn_logit_softcapping", None),
            final_softcap=getattr(config, "final_logit_softcapping", None),
        ),
    )


def read_gpt_oss(config: Any, architecture: str, name: str) -> ModelConfig:
    """gpt-oss: sliding and full layers (``layer_types``), YaRN rotary, biases on every
    projection, sinks, and experts whose weights may come as MXFP4 blocks (de-quantized
    at load: ``inference.runner.mxfp4``)."""
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = (
            quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        )
        if str(method).lower().removeprefix("quantizationmethod.") != "mxfp4":
            raise UnsupportedModelError(architecture, f"quantization_config {method!r} (supported: mxfp4)")
    rope_theta, rope_scaling = rope_of(config, architecture, ("default", "yarn"))
    num_layers = config.num_hidden_layers
    return ModelConfig(
        **shared_fields(config, architecture, name),
        num_kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", True)),
        attention_out_bias=bool(getattr(config, "attention_bias", True)),
        sliding_window=getattr(config, "sliding_window", None),
        layer_types=tuple(getattr(config, "layer_types", None) or ("full_attention",) * num_layers),
        gpt_oss=GptOssConfig(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            swiglu_alpha=float(getattr(config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(config.swiglu_limit),
        ),
    )
