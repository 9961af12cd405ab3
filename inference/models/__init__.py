"""Our own decoder implementations (plain PyTorch), keyed by HF architecture name.

Each model class declares its KV cache through ``kv_spec_for(config)`` (a
``KVSpec``); the engine sizes and lays out the pool from that alone."""

from __future__ import annotations

from torch import nn

from inference.kv.spec import KVSpec
from inference.model_config import ModelConfig
from inference.models.deepseek_v3 import DeepseekV3ForCausalLM
from inference.models.gemma import GemmaForCausalLM
from inference.models.gpt_oss import GptOssForCausalLM
from inference.models.llama import LlamaForCausalLM

# Llama, Mistral and Qwen2 share one decoder; the differences (q/k/v bias, tied head)
# are ModelConfig flags.
MODEL_REGISTRY: dict[
    str,
    type[LlamaForCausalLM] | type[DeepseekV3ForCausalLM] | type[GemmaForCausalLM] | type[GptOssForCausalLM],
] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}


def build_model(config: ModelConfig) -> nn.Module:
    return MODEL_REGISTRY[config.architecture](config)


def kv_spec_for(config: ModelConfig) -> KVSpec:
    """The pool layout of ``config``'s model class."""
    return MODEL_REGISTRY[config.architecture].kv_spec_for(config)


__all__ = [
    "MODEL_REGISTRY",
    "DeepseekV3ForCausalLM",
    "GemmaForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "build_model",
    "kv_spec_for",
]
