"""Our own decoder implementations (plain PyTorch), keyed by HF architecture name."""

from __future__ import annotations

from inference.model_config import ModelConfig
from inference.models.llama import LlamaForCausalLM

# Llama, Mistral and Qwen2 share one decoder; the differences (q/k/v bias, tied head)
# are ModelConfig flags.
MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


def build_model(config: ModelConfig) -> LlamaForCausalLM:
    return MODEL_REGISTRY[config.architecture](config)


__all__ = ["MODEL_REGISTRY", "LlamaForCausalLM", "build_model"]
