"""The model shape our decoder needs, read from a transformers ``PretrainedConfig``.

Keeping our own small dataclass (instead of passing the HF config around) pins
down exactly which features we implement; anything else is rejected up front
with an ``UnsupportedModelError`` rather than silently producing wrong logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inference.errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "GptOssForCausalLM",
)
# GGUF-derived configs carry no ``architectures``; map their model_type instead.
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DEEPSEEK_ROPE_TYPES = ("default", "yarn")


@dataclass
class MLAConfig:
    """Multi-head latent attention (DeepSeek V2/V3)."""

    q_lora_rank: int | None  # None: q comes straight from q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float  # qk_head_dim**-0.5, times YaRN's mscale**2 when it applies
    rope_interleave: bool  # rotary pairs are (x0, x1), (x2, x3), ... rather than halves

    @property
    def latent_dim(self) -> int:
        """What the pool keeps per token and layer: normalised c_kv, then rotated k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass
class MoEConfig:
    """DeepSeek-V3 mixture of experts (sigmoid router, group-limited top-k)."""

    num_experts: int
    top_k: int
    num_groups: int
    topk_groups: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    num_shared_experts: int
    intermediate_size: int  # of one routed expert
    first_dense_layers: int  # first_k_dense_replace: these layers use a dense MLP


@dataclass
class GemmaConfig:
    """Gemma 2 / Gemma 3: what differs from the Llama decoder."""

    query_pre_attn_scalar: float  # scores are scaled by its inverse square root
    local_rope_theta: float  # the sliding layers' rotary base (Gemma 3; Gemma 2: rope_theta)
    qk_norm: bool  # Gemma 3: (1 + w) RMSNorm of each head's q and k before rotary
    attn_softcap: float | None  # Gemma 2: scores become cap * tanh(scores / cap)
    final_softcap: float | None  # logits become cap * tanh(logits / cap)


@dataclass
class GptOssConfig:
    """gpt-oss: every layer has learned attention sinks; the MLP is a mixture of experts."""

    num_experts: int
    top_k: int  # softmax over the top-k router logits
    swiglu_alpha: float  # gate * sigmoid(alpha * gate)
    swiglu_limit: float  # gate clamped above, up clamped both ways, at this value


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections (Qwen2 always, Llama when attention_bias)
    attention_out_bias: bool = False  # bias on o_proj (Llama's attention_bias also covers it)
    mlp_bias: bool = False
    sliding_window: int | None = None  # the window of the sliding layers (Mistral: every layer)
    # Per layer: "sliding_attention" or "full_attention" (None: every layer slides when
    # ``sliding_window`` is set, else none does).
    layer_types: tuple[str, ...] | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    name: str = ""
    mla: MLAConfig | None = None  # DeepSeek: the attention caches a latent, not K and V
    moe: MoEConfig | None = None
    gemma: GemmaConfig | None = None
    gpt_oss: GptOssConfig | None = None

    @property
    def max_model_len(self) -> int:
        """Longest context the model takes (sliding layers attend within their window at
        any length: ``inference.layers.window_attention``)."""
        return self.max_position_embeddings

    @property
    def layer_windows(self) -> tuple[int | None, ...] | None:
        """Each layer's attention window (None: full attention), or None when no layer has one."""
        if not self.sliding_window:
            return None
        if self.layer_types is None:
            return (self.sliding_window,) * self.num_layers
        windows = tuple(self.sliding_window if t == "sliding_attention" else None for t in self.layer_types)
        return windows if any(w is not None for w in windows) else None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token costs over all layers, per byte of element size
        (the model class's ``kv_spec`` is what the engine sizes the pool from)."""
        if self.mla is not None:
            return self.num_layers * self.mla.latent_dim
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, config: Any, name: str = "") -> ModelConfig:
        """Build from a transformers config; raises ``UnsupportedModelError`` for what we lack."""
        architecture = _architecture_of(config)
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                architecture, f"supported architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if architecture in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
            return _gemma_from_hf(config, architecture, name)
        if architecture == "GptOssForCausalLM":
            return _gpt_oss_from_hf(config, architecture, name)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(architecture, f"hidden_act {act!r} (only silu)")
        if architecture == "DeepseekV3ForCausalLM":
            return _deepseek_v3_from_hf(config, architecture, name)

        rope_theta, rope_scaling = _rope_of(config, architecture)
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        eos = config.eos_token_id
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        llama_bias = bool(getattr(config, "attention_bias", False)) and not is_qwen2
        sliding = getattr(config, "sliding_window", None)
        if is_qwen2 and not getattr(config, "use_sliding_window", False):
            sliding = None  # Qwen2 configs carry a window they do not use
        return cls(
            architecture=architecture,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_bias=is_qwen2 or llama_bias,
            attention_out_bias=llama_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            sliding_window=sliding,
            eos_token_ids=eos_ids,
            bos_token_id=getattr(config, "bos_token_id", None),
            name=name or getattr(config, "name_or_path", "") or architecture,
        )


def _architecture_of(config: Any) -> str:
    archs = getattr(config, "architectures", None) or []
    if archs:
        return archs[0]
    model_type = getattr(config, "model_type", "") or "unknown"
    return _MODEL_TYPE_TO_ARCH.get(model_type, model_type)


def _deepseek_v3_from_hf(config: Any, architecture: str, name: str) -> ModelConfig:
    """DeepSeek-V3: MLA + MoE. Features of the reference implementation we do not have
    (other routers, quantised checkpoints, MoE every n-th layer) are refused by name."""

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

    theta, scaling = _rope_of(config, architecture, DEEPSEEK_ROPE_TYPES)
    qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    softmax_scale = qk_head_dim**-0.5
    if scaling is not None:  # YaRN (the only non-default type we accept here)
        if scaling.get("factor") is None:
            raise refuse("rope_scaling yarn without 'factor'")
        mscale_all_dim = scaling.get("mscale_all_dim") or 0
        if mscale_all_dim:
            mscale = yarn_get_mscale(scaling["factor"], mscale_all_dim)
            softmax_scale *= mscale * mscale
    eos = config.eos_token_id
    num_heads = config.num_attention_heads
    return ModelConfig(
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_heads,  # after kv_b_proj every head has its own K and V
        head_dim=qk_head_dim,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        bos_token_id=getattr(config, "bos_token_id", None),
        name=name or getattr(config, "name_or_path", "") or architecture,
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


def _gemma_from_hf(config: Any, architecture: str, name: str) -> ModelConfig:
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
        rope_theta, rope_scaling = _rope_of(config, architecture, ("default", "linear"))
        local_theta = float(getattr(config, "rope_local_base_freq", None) or rope_theta)
    gemma3 = architecture == "Gemma3ForCausalLM"
    eos = config.eos_token_id
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    return ModelConfig(
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        attention_out_bias=bool(getattr(config, "attention_bias", False)),
        sliding_window=getattr(config, "sliding_window", None),
        layer_types=layer_types or ("full_attention",) * config.num_hidden_layers,
        eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        bos_token_id=getattr(config, "bos_token_id", None),
        name=name or getattr(config, "name_or_path", "") or architecture,
        gemma=GemmaConfig(
            query_pre_attn_scalar=float(config.query_pre_attn_scalar),
            local_rope_theta=local_theta if gemma3 else rope_theta,
            qk_norm=gemma3,
            attn_softcap=getattr(config, "attn_logit_softcapping", None),
            final_softcap=getattr(config, "final_logit_softcapping", None),
        ),
    )


def _gpt_oss_from_hf(config: Any, architecture: str, name: str) -> ModelConfig:
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
    rope_theta, rope_scaling = _rope_of(config, architecture, ("default", "yarn"))
    eos = config.eos_token_id
    num_layers = config.num_hidden_layers
    return ModelConfig(
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=num_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", True)),
        attention_out_bias=bool(getattr(config, "attention_bias", True)),
        sliding_window=getattr(config, "sliding_window", None),
        layer_types=tuple(getattr(config, "layer_types", None) or ("full_attention",) * num_layers),
        eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        bos_token_id=getattr(config, "bos_token_id", None),
        name=name or getattr(config, "name_or_path", "") or architecture,
        gpt_oss=GptOssConfig(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            swiglu_alpha=float(getattr(config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(config.swiglu_limit),
        ),
    )


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched ``scale`` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope_of(
    config: Any, architecture: str, supported: tuple[str, ...] = SUPPORTED_ROPE_TYPES
) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling dict or None). transformers 5 keeps both in ``rope_parameters``;
    older versions have ``rope_theta`` and ``rope_scaling`` attributes."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling: dict[str, Any] | None = dict(params)
    else:
        theta = float(getattr(config, "rope_theta", 10000.0))
        scaling = dict(getattr(config, "rope_scaling", None) or {}) or None
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in supported:
            raise UnsupportedModelError(architecture, f"rope type {rope_type!r} (supported: {supported})")
        if rope_type == "default":
            scaling = None
        else:
            scaling.pop("type", None)
            scaling["rope_type"] = rope_type
            scaling.pop("rope_theta", None)
    partial = getattr(config, "partial_rotary_factor", 1.0) or 1.0
    if scaling is not None:
        partial = scaling.get("partial_rotary_factor", partial)
    if not math.isclose(partial, 1.0):
        raise UnsupportedModelError(architecture, f"partial_rotary_factor {partial}")
    return theta, scaling
