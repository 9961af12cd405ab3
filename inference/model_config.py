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

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# GGUF-derived configs carry no ``architectures``; map their model_type instead.
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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
    sliding_window: int | None = None  # Mistral; we attend fully, so max_model_len is capped by it
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    name: str = ""

    @property
    def max_model_len(self) -> int:
        """Longest context we compute exactly (full attention equals sliding-window attention below it)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token costs over all layers, per byte of element size."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, config: Any, name: str = "") -> ModelConfig:
        """Build from a transformers config; raises ``UnsupportedModelError`` for what we lack."""
        architecture = _architecture_of(config)
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                architecture, f"supported architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(architecture, f"hidden_act {act!r} (only silu)")

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


def _rope_of(config: Any, architecture: str) -> tuple[float, dict[str, Any] | None]:
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
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                architecture, f"rope type {rope_type!r} (supported: {SUPPORTED_ROPE_TYPES})"
            )
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
