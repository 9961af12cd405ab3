"""Gemma 2 and Gemma 3 GGUF files, written as llama.cpp's converter writes them (norm
weights with Gemma's ``+ 1`` added; no ``query_pre_attn_scalar``; sliding layers, soft-caps
and the two rotary bases as llama.cpp's keys), load into the configuration and weights of
the checkpoint they were made from, and decode transformers' greedy tokens on the same
de-quantized weights under the original config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file

from inference.models.registry import read_model_config
from inference.runner.model_loader import ensure_gguf_converted, load_model
from tests.support.gguf_greedy import assert_gguf_greedy_matches
from tests.support.gguf_sliding import write_sliding_gguf
from tests.support.sliding_models import make_sliding_model_dir, sliding_config

# Gemma ties its head to the embedding (llama.cpp's gemma2 has no output tensor); the
# Gemma 3 case gives both rotary bases non-default values and its full layers linear scaling.
OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma2": {"tie_word_embeddings": True, "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0},
    "gemma3": {
        "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 500000.0},
        },
    },
}
CASES = [
    pytest.param("gemma2", GGMLQuantizationType.Q8_0, id="gemma2-q8_0"),
    pytest.param("gemma3", GGMLQuantizationType.Q4_0, id="gemma3-q4_0"),
]


def _reference(family: str, converted: Path) -> Any:
    """transformers' model under the original checkpoint's config, holding the weights
    transformers' own GGUF reader de-quantized (norms shifted back)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(sliding_config(family, **OVERRIDES[family]), dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(load_file(converted / "model.safetensors"), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    hf.eval().generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


@pytest.mark.parametrize(("family", "qtype"), CASES)
def test_gguf_gemma_loads_the_original_config_and_decodes_transformers_tokens(
    tmp_path: Path, family: str, qtype: GGMLQuantizationType
) -> None:
    model_dir = make_sliding_model_dir(tmp_path / family, family, seed=3, **OVERRIDES[family])
    gguf = write_sliding_gguf(model_dir, tmp_path / f"{family}.gguf", family, qtype)
    cache = tmp_path / "cache"
    loaded = load_model(gguf, device="cpu", weights_cache_dir=cache)
    model, _, config = loaded

    original = read_model_config(sliding_config(family, **OVERRIDES[family]))
    for field in ("layer_types", "sliding_window", "gemma", "rope_theta", "rope_scaling", "head_dim"):
        assert getattr(config, field) == getattr(original, field), field
    source = load_file(model_dir / "model.safetensors")
    norms = [n for n in source if n.endswith("norm.weight")]
    assert norms
    ours = model.state_dict()
    for name in norms:  # stored as w + 1 in fp32: back within its rounding
        torch.testing.assert_close(ours[name], source[name], rtol=0, atol=2e-7)

    hf = _reference(family, ensure_gguf_converted(gguf, cache))
    assert_gguf_greedy_matches(gguf, loaded, hf, family)
