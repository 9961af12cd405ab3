"""Fixtures for the model tests: tiny random-weight checkpoints per architecture and
the real SmolLM2, each loaded once per session both into our model and into HF's.

Imported by the test modules that use them (kept out of conftest.py, which the
engine tests share)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inference.model_config import ModelConfig
from inference.models import LlamaForCausalLM
from inference.runner.model_files import default_model_path
from inference.runner.model_loader import ensure_gguf_converted, load_model
from inference.tokenizer import Tokenizer
from tests.support.fakes import make_tiny_model_dir

# name -> (arch, config overrides)
TINY_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
    "llama3-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,  # small, so all three bands occur
            },
            "head_dim": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    ),
    "linear-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
}


@dataclass
class LoadedPair:
    ours: LlamaForCausalLM
    hf: torch.nn.Module
    tokenizer: Tokenizer
    config: ModelConfig


def _load_pair(model_dir: Any, ours_path: Any | None = None) -> LoadedPair:
    from transformers import AutoModelForCausalLM

    ours, tokenizer, config = load_model(ours_path if ours_path is not None else model_dir, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # compare fixed-length greedy runs
    hf.generation_config.pad_token_id = 0
    return LoadedPair(ours, hf, tokenizer, config)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], LoadedPair]:
    """``tiny_pair(name)``: the variant built and loaded on first use, then reused."""
    root = tmp_path_factory.mktemp("tiny-models")
    cache: dict[str, LoadedPair] = {}

    def get(name: str) -> LoadedPair:
        if name not in cache:
            arch, overrides = TINY_VARIANTS[name]
            seed = list(TINY_VARIANTS).index(name)
            cache[name] = _load_pair(make_tiny_model_dir(root / name, arch=arch, seed=seed, **overrides))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def smollm2_pair() -> LoadedPair:
    """The real default model (GGUF), ours and HF's on the same de-quantised weights."""
    gguf = default_model_path()
    return _load_pair(ensure_gguf_converted(gguf), ours_path=gguf)
