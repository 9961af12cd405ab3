"""Our own decoder implementations (plain PyTorch), keyed by HF architecture name in
``registry`` and each keeping the ``contract.CausalLM`` protocol.

Each model class declares its KV cache through ``kv_spec_for(config)`` (a
``KVSpec``); the engine sizes and lays out the pool from that alone."""

from __future__ import annotations

from inference.models.contract import CausalLM
from inference.models.deepseek_v3 import DeepseekV3ForCausalLM
from inference.models.gemma import GemmaForCausalLM
from inference.models.gpt_oss import GptOssForCausalLM
from inference.models.llama import LlamaForCausalLM
from inference.models.registry import (
    ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    build_model,
    kv_spec_for,
    read_model_config,
)

__all__ = [
    "ARCHITECTURES",
    "SUPPORTED_ARCHITECTURES",
    "CausalLM",
    "DeepseekV3ForCausalLM",
    "GemmaForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "build_model",
    "kv_spec_for",
    "read_model_config",
]
