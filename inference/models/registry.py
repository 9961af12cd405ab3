"""The one table of supported architectures: HF architecture name -> our model class
and the reader of its config.

Everything that asks "is this model supported, and how is it built" reads this table:
``read_model_config``, the loader (``build_model``),
pool sizing (``kv_spec_for``) and GGUF files, whose configs carry a ``model_type``
rather than an architecture name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference.errors import UnsupportedModelError
from inference.kv.spec import KVSpec
from inference.model_config import ModelConfig
from inference.models.config_readers import (
    read_deepseek_v3,
    read_granite,
    read_llama,
    read_olmo2,
    read_phi3,
    read_qwen3,
    read_qwen3_moe,
    read_smollm3,
)
from inference.models.contract import CausalLM, CausalLMClass
from inference.models.deepseek_v3 import DeepseekV3ForCausalLM
from inference.models.gemma import GemmaForCausalLM
from inference.models.gpt_oss import GptOssForCausalLM
from inference.models.hybrid_readers import (
    read_qwen3_5,
    read_qwen3_5_moe,
    read_qwen3_5_vision_language,
    read_qwen3_next,
)
from inference.models.llama import LlamaForCausalLM
from inference.models.qwen3_next import Qwen3NextForCausalLM
from inference.models.sliding_readers import read_gemma, read_gpt_oss

ConfigReader = Callable[[Any, str, str], ModelConfig]  # (hf_config, architecture, name)


@dataclass(frozen=True)
class Architecture:
    name: str  # HF's ``architectures[0]``, e.g. "Qwen3ForCausalLM"
    model_type: str  # HF's ``model_type`` (what a GGUF-derived config carries instead)
    model_class: CausalLMClass
    read_config: ConfigReader


# The Llama decoder serves every family but DeepSeek-V3, Gemma, gpt-oss and the hybrid
# linear-attention Qwens (Qwen3-Next, Qwen3.5); the
# differences between them are ModelConfig flags, set by each family's reader.
_TABLE: tuple[Architecture, ...] = (
    Architecture("LlamaForCausalLM", "llama", LlamaForCausalLM, read_llama),
    Architecture("MistralForCausalLM", "mistral", LlamaForCausalLM, read_llama),
    Architecture("Qwen2ForCausalLM", "qwen2", LlamaForCausalLM, read_llama),
    Architecture("Qwen3ForCausalLM", "qwen3", LlamaForCausalLM, read_qwen3),
    Architecture("Qwen3MoeForCausalLM", "qwen3_moe", LlamaForCausalLM, read_qwen3_moe),
    Architecture("Phi3ForCausalLM", "phi3", LlamaForCausalLM, read_phi3),
    Architecture("Olmo2ForCausalLM", "olmo2", LlamaForCausalLM, read_olmo2),
    Architecture("GraniteForCausalLM", "granite", LlamaForCausalLM, read_granite),
    Architecture("SmolLM3ForCausalLM", "smollm3", LlamaForCausalLM, read_smollm3),
    Architecture("DeepseekV3ForCausalLM", "deepseek_v3", DeepseekV3ForCausalLM, read_deepseek_v3),
    Architecture("Gemma2ForCausalLM", "gemma2", GemmaForCausalLM, read_gemma),
    Architecture("Gemma3ForCausalLM", "gemma3_text", GemmaForCausalLM, read_gemma),
    Architecture("GptOssForCausalLM", "gpt_oss", GptOssForCausalLM, read_gpt_oss),
    Architecture("Qwen3NextForCausalLM", "qwen3_next", Qwen3NextForCausalLM, read_qwen3_next),
    Architecture("Qwen3_5ForCausalLM", "qwen3_5_text", Qwen3NextForCausalLM, read_qwen3_5),
    Architecture("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", Qwen3NextForCausalLM, read_qwen3_5_moe),
    Architecture(
        "Qwen3_5ForConditionalGeneration", "qwen3_5", Qwen3NextForCausalLM, read_qwen3_5_vision_language
    ),
    Architecture(
        "Qwen3_5MoeForConditionalGeneration",
        "qwen3_5_moe",
        Qwen3NextForCausalLM,
        read_qwen3_5_vision_language,
    ),
)
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in _TABLE}
_BY_MODEL_TYPE: dict[str, Architecture] = {a.model_type: a for a in _TABLE}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURES)


def architecture_name(hf_config: Any) -> str:
    """The config's architecture: ``architectures[0]``, or (GGUF-derived configs carry
    none) the one our table pairs with its ``model_type``."""
    archs = getattr(hf_config, "architectures", None) or []
    if archs:
        return archs[0]
    model_type = getattr(hf_config, "model_type", "") or "unknown"
    entry = _BY_MODEL_TYPE.get(model_type)
    return entry.name if entry is not None else model_type


def lookup(architecture: str) -> Architecture:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise UnsupportedModelError(
            architecture, f"supported architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
        ) from None


def read_model_config(hf_config: Any, name: str = "") -> ModelConfig:
    """Our ``ModelConfig`` of a transformers config; ``UnsupportedModelError`` for an
    architecture (or a feature of one) we do not implement."""
    architecture = architecture_name(hf_config)
    return lookup(architecture).read_config(hf_config, architecture, name)


def build_model(config: ModelConfig) -> CausalLM:
    return lookup(config.architecture).model_class(config)


def kv_spec_for(config: ModelConfig) -> KVSpec:
    """The pool layout of ``config``'s model class."""
    return lookup(config.architecture).model_class.kv_spec_for(config)
