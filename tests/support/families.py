"""Tiny random-weight checkpoints of the model families served by the shared Llama
decoder beyond Llama itself, each built from transformers' own config class with the
features that set the family apart switched on (and its norms' weights randomised, as
HF initialises them to ones, which would hide a misplaced norm)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from tests.support.fakes import TINY_DEFAULTS, smollm2_tokenizer_dir

_COMPLETE = "families-complete"

# family -> (config class name in transformers, architecture, overrides of TINY_DEFAULTS)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),  # explicit, != hidden / heads
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": 24,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],  # one dense layer among the sparse ones
        },
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            # Partial rotary (12 of 16 features) and LongRoPE, with a short original
            # context so that prompts cross from the short to the long factors.
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.1 * i for i in range(6)],
                "long_factor": [2.0 + 0.3 * i for i in range(6)],
                "original_max_position_embeddings": 64,
            },
            "original_max_position_embeddings": 64,
        },
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {
            "embedding_multiplier": 3.0,
            "attention_multiplier": 0.3,
            "residual_multiplier": 0.5,
            "logits_scaling": 2.0,
        },
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),  # NoPE on every fourth layer
}


def family_hf_config(family: str, **overrides: Any) -> Any:
    import transformers

    class_name, architecture, family_overrides = FAMILIES[family]
    kwargs = {**TINY_DEFAULTS, "num_hidden_layers": 4, **family_overrides, **overrides}
    config = getattr(transformers, class_name)(**kwargs)
    config.architectures = [architecture]
    return config


def make_family_model_dir(path: Path, family: str, seed: int = 0, **overrides: Any) -> Path:
    """A random-weight HF directory (config, safetensors, SmolLM2 tokenizer) of ``family``;
    ``overrides`` replace config fields (``tools/gpu_check`` passes real models' shapes)."""
    from transformers import AutoModelForCausalLM

    if (path / _COMPLETE).is_file():
        return path
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(family_hf_config(family, **overrides), dtype=torch.float32)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    for file in smollm2_tokenizer_dir().iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, path / file.name)
    (path / _COMPLETE).write_text(family)
    return path
