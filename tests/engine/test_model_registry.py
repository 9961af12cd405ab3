"""The architecture table and the model contract: every row builds a model that keeps
the ``CausalLM`` protocol, GGUF-style configs (``model_type`` only) resolve through the
table, and the refusal of an unknown architecture names the supported ones."""

from __future__ import annotations

import pytest
import torch

from inference.errors import UnsupportedModelError
from inference.models import ARCHITECTURES, CausalLM, build_model, kv_spec_for
from inference.models.registry import architecture_name, read_model_config
from tests.support.fakes import tiny_hf_config
from tests.support.families import FAMILIES, family_hf_config
from tests.support.hybrid_models import (
    HYBRID_FAMILIES,
    VISION_LANGUAGE,
    hybrid_config,
    vision_language_config,
)
from tests.support.sliding_models import FAMILIES as SLIDING_FAMILIES
from tests.support.sliding_models import sliding_config


def _tiny_configs() -> dict[str, object]:
    configs = {name: family_hf_config(name) for name in FAMILIES}
    for arch in ("llama", "qwen2", "mistral", "deepseek_v3"):
        configs[arch] = tiny_hf_config(arch)
    for name in SLIDING_FAMILIES:
        configs[f"sliding-{name}"] = sliding_config(name)
    for name in HYBRID_FAMILIES:
        configs[f"hybrid-{name}"] = hybrid_config(name)
    for name in VISION_LANGUAGE:
        configs[f"vision-language-{name}"] = vision_language_config(name)
    return configs


CONFIGS = _tiny_configs()


def test_every_table_row_is_exercised() -> None:
    covered = {read_model_config(c).architecture for c in CONFIGS.values()}
    assert covered == set(ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_architecture_builds_a_model_keeping_the_contract(name: str) -> None:
    config = read_model_config(CONFIGS[name])
    with torch.device("meta"):
        model = build_model(config)
    assert isinstance(model, CausalLM)
    assert isinstance(model.supports_cuda_graphs, bool)
    assert model.kv_spec == kv_spec_for(config)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_config_without_architectures_resolves_by_model_type(name: str) -> None:
    hf_config = family_hf_config(name)
    expected = hf_config.architectures[0]
    hf_config.architectures = None  # as transformers' GGUF reader leaves it
    assert architecture_name(hf_config) == expected
    assert read_model_config(hf_config).architecture == expected


def test_an_unknown_architecture_is_refused_naming_the_supported_ones() -> None:
    hf_config = tiny_hf_config("llama")
    hf_config.architectures = ["FancyNewLM"]
    with pytest.raises(UnsupportedModelError, match="FancyNewLM.*Qwen3ForCausalLM"):
        read_model_config(hf_config)


def test_family_features_refused_by_name() -> None:
    sliding = family_hf_config("qwen3", use_sliding_window=True, sliding_window=32, max_window_layers=0)
    with pytest.raises(UnsupportedModelError, match="sliding"):
        read_model_config(sliding)
    partial = tiny_hf_config("llama")
    partial.partial_rotary_factor = 0.5
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor"):
        read_model_config(partial)
