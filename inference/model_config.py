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
    """A mixture of experts: DeepSeek-V3's (sigmoid router, group-limited top-k, shared
    experts) or Qwen3-MoE's (softmax router, plain top-k, no shared expert)."""

    num_experts: int
    top_k: int
    num_groups: int
    topk_groups: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    num_shared_experts: int
    intermediate_size: int  # of one routed expert
    first_dense_layers: int  # first_k_dense_replace: these layers use a dense MLP
    scoring: str = "sigmoid"  # "sigmoid" (DeepSeek-V3) or "softmax" (Qwen3-MoE)
    sparse_step: int = 1  # decoder_sparse_step: layer i is sparse when (i + 1) % step == 0
    dense_layers: tuple[int, ...] = ()  # mlp_only_layers: always a dense MLP

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` routes to experts (else a dense MLP of ``intermediate_size``)."""
        if layer_idx < self.first_dense_layers or layer_idx in self.dense_layers:
            return False
        return (layer_idx + 1) % self.sparse_step == 0


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
class GatedDeltaNetConfig:
    """Hybrid linear-attention models (Qwen3-Next, Qwen3.5): the Gated DeltaNet layers'
    shape. Each layer is ``"linear_attention"`` (a recurrent layer with a fixed-size state
    per sequence) or ``"full_attention"`` (gated attention over the paged KV cache)."""

    layer_types: tuple[str, ...]
    num_k_heads: int
    num_v_heads: int  # a multiple of num_k_heads: each key head serves consecutive value heads
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int  # the short causal convolution's width
    # Qwen3-Next: q, k, v and z in one projection grouped per key head (``in_proj_qkvz``,
    # ``in_proj_ba``); Qwen3.5: separate ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``.
    fused_projections: bool = False
    shared_expert_intermediate_size: int = 0  # Qwen3-Next's MoE layers: the gated shared expert

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t != "linear_attention")

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q and k of every key head, then v of every value head."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


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
    linear_attention: GatedDeltaNetConfig | None = None  # hybrid linear-attention models
    # Variations of the shared Llama decoder; the defaults are plain Llama.
    qk_norm: str | None = (
        None  # "head": RMSNorm of each head's q and k (Qwen3); "full": of the whole projection (OLMo 2)
    )
    post_norms: bool = False  # OLMo 2: RMSNorm of the attention and MLP outputs, none of their inputs
    partial_rotary_dim: int | None = None  # Phi-3: only the first features of a head rotate; None = head_dim
    rope_layers: tuple[bool, ...] = ()  # SmolLM3: False for a layer without rotary (NoPE); () = all rotate
    embedding_multiplier: float = 1.0  # Granite: embeddings times this
    attention_multiplier: float | None = None  # Granite: the softmax scale; None = head_dim**-0.5
    residual_multiplier: float = 1.0  # Granite: each block's output times this before the residual add
    logits_scaling: float = 1.0  # Granite: logits divided by this

    @property
    def rotary_dim(self) -> int:
        """Features of each head that rotary embeddings turn (the first ones)."""
        return self.partial_rotary_dim or self.head_dim

    def layer_uses_rope(self, layer_idx: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer_idx]

    @property
    def softmax_scale(self) -> float:
        return self.attention_multiplier if self.attention_multiplier is not None else self.head_dim**-0.5

    @property
    def is_plain_llama(self) -> bool:
        """True where the decoder is exactly Llama's: the one-call CPU decode stack and
        the fused rotary-and-store kernel assume it."""
        return (
            self.qk_norm is None
            and not self.post_norms
            and self.rotary_dim == self.head_dim
            and all(self.rope_layers)
            and self.moe is None
            and self.mla is None
            and self.embedding_multiplier == 1.0
            and self.attention_multiplier is None
            and self.residual_multiplier == 1.0
            and self.logits_scaling == 1.0
        )

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


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched ``scale`` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_of(
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
    return theta, scaling


def partial_rotary_factor(config: Any) -> float:
    """The fraction of each head that rotates (1.0 for most models; Phi-3 may have less)."""
    partial = getattr(config, "partial_rotary_factor", None)
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
        partial = params["partial_rotary_factor"]
    return float(partial or 1.0)
