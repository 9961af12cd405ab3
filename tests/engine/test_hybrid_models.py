"""Hybrid linear-attention models (Qwen3-Next, Qwen3.5), exact against transformers on
tiny random weights, our model driven directly over a paged KV pool and a recurrent state
pool (``tests.support.hybrid_models``):

- every position's logits of prompts of 5 to 230 tokens within fp32 tolerance of HF's;
- the same prompt fed in chunks, each continuing from the saved states;
- greedy decode by our forward in a loop gives HF ``generate``'s tokens;
- several sequences packed in one step equal each run alone, and leave the other slots alone.
"""

from __future__ import annotations

import random

import pytest
import torch

from inference.models.registry import kv_spec_for, read_model_config
from tests.support.hf_generate import hf_greedy
from tests.support.hybrid_models import (
    HYBRID_FAMILIES,
    VISION_LANGUAGE,
    HybridRunner,
    make_hybrid_pair,
    make_vision_language_pair,
)

PROMPT_LENGTHS = (5, 37, 120, 230)
NEW_TOKENS = 8
ATOL = 2e-5


@pytest.fixture(scope="module", params=sorted(HYBRID_FAMILIES))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module]:
    return make_hybrid_pair(request.param)


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed * 1000 + length)
    return [rng.randrange(1, 320) for _ in range(length)]


def _hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _hf_greedy(hf: torch.nn.Module, ids: list[int]) -> list[int]:
    return hf_greedy(hf, ids, NEW_TOKENS)


def test_specs_split_the_layers(pair: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    _, ours = pair
    config = ours.config
    assert config.linear_attention.layer_types == (
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    )
    assert kv_spec_for(config).num_layers == 1  # only the full-attention layer has KV
    spec = ours.recurrent_spec
    assert [s.layer for s in spec.layers] == [0, 1, 2]
    conv_dim = 2 * 2 * 8 + 4 * 12
    assert spec.layers[0].conv_shape == (conv_dim, 3)
    assert spec.layers[0].ssm_shape == (4, 8, 12)
    assert spec.ssm_dtype == torch.float32


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_prompt_logits_match_hf(pair: tuple[torch.nn.Module, torch.nn.Module], length: int) -> None:
    hf, ours = pair
    prompt = _prompt(length)
    runner = HybridRunner(ours)
    runner.add_sequence()
    ours_logits = runner.step([prompt])
    expected = _hf_logits(hf, prompt)
    assert expected.abs().max() > 0.1  # the comparison below is not of near-zero logits
    torch.testing.assert_close(ours_logits, expected, atol=ATOL, rtol=1e-4)


def test_reference_path_matches_hf(
    pair: tuple[torch.nn.Module, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the C kernel out of the way the chunked PyTorch form serves the prompt."""
    from chatsite_kernels.cpu import gated_delta as cpu_gated_delta

    monkeypatch.setattr(cpu_gated_delta, "supports", lambda *tensors: False)
    hf, ours = pair
    prompt = _prompt(150, seed=4)
    runner = HybridRunner(ours)
    runner.add_sequence()
    logits = torch.cat(
        [runner.step([prompt[:100]]), runner.step([prompt[100:101]]), runner.step([prompt[101:]])]
    )
    torch.testing.assert_close(logits, _hf_logits(hf, prompt), atol=ATOL, rtol=1e-4)


def test_chunked_prompt_continues_from_saved_states(pair: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    """Chunks of 64 (one whole delta-rule chunk), 50, 1 (a one-token prefill step) and the rest."""
    hf, ours = pair
    prompt = _prompt(230, seed=1)
    runner = HybridRunner(ours)
    runner.add_sequence()
    pieces, start = [], 0
    for size in (64, 50, 1, 115):
        pieces.append(runner.step([prompt[start : start + size]]))
        start += size
    torch.testing.assert_close(torch.cat(pieces), _hf_logits(hf, prompt), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("length", (5, 120))
def test_greedy_decode_matches_hf_generate(
    pair: tuple[torch.nn.Module, torch.nn.Module], length: int
) -> None:
    hf, ours = pair
    prompt = _prompt(length, seed=2)
    runner = HybridRunner(ours)
    runner.add_sequence()
    tokens = [int(runner.step([prompt])[-1].argmax())]
    for _ in range(NEW_TOKENS - 1):
        tokens.append(int(runner.step([[tokens[-1]]])[-1].argmax()))
    assert tokens == _hf_greedy(hf, prompt)


def test_packed_sequences_equal_one_at_a_time(pair: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    """Three prompts prefilled in one step, then decoded together (one token each per step,
    and a step mixing a decode with a prefill chunk), against each run alone."""
    _, ours = pair
    prompts = [_prompt(n, seed=3) for n in (5, 70, 33)]

    def alone(prompt: list[int], extra: list[int]) -> torch.Tensor:
        runner = HybridRunner(ours, seed=5)
        runner.add_sequence()
        return torch.cat([runner.step([prompt]), runner.step([extra[:1]]), runner.step([extra[1:]])])

    extras = [_prompt(4, seed=10 + i) for i in range(3)]
    runner = HybridRunner(ours)
    for _ in prompts:
        runner.add_sequence()
    packed = runner.step(prompts)
    decode = runner.step([e[:1] for e in extras])  # one token each: the batched recurrent path
    mixed = runner.step([e[1:] for e in extras])  # three tokens each
    offsets = [0, 5, 75, 108]
    for i, (prompt, extra) in enumerate(zip(prompts, extras, strict=True)):
        got = torch.cat([packed[offsets[i] : offsets[i + 1]], decode[i : i + 1], mixed[3 * i : 3 * i + 3]])
        torch.testing.assert_close(got, alone(prompt, extra), atol=ATOL, rtol=1e-4)


def test_a_step_leaves_other_slots_alone(pair: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    _, ours = pair
    runner = HybridRunner(ours)
    runner.add_sequence()
    before = [t.clone() for t in runner.states.conv + runner.states.ssm]
    runner.step([_prompt(20)])
    slot = runner.slots[0]
    for old, new in zip(before, runner.states.conv + runner.states.ssm, strict=True):
        others = [s for s in range(old.shape[0]) if s != slot]
        torch.testing.assert_close(new[others], old[others], rtol=0, atol=0, equal_nan=True)
        assert not new[slot].isnan().any()  # written: the NaN it held was not read


def test_loader_leaves_out_the_mtp_head(pair: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    """Checkpoints carry a multi-token-prediction head; it is ignored, anything else extra is not."""
    hf, _ = pair
    fresh = type(pair[1])(pair[1].config)
    weights = dict(hf.state_dict())
    weights["mtp.fc.weight"] = torch.zeros(2, 2)
    fresh.load_weights(weights)
    weights["model.layers.0.extra.weight"] = torch.zeros(2)
    with pytest.raises(KeyError, match="lacks"):
        fresh.load_weights(weights)


def test_readers_refuse_what_is_not_implemented() -> None:
    from transformers import Qwen3_5TextConfig

    from inference.errors import UnsupportedModelError

    config = Qwen3_5TextConfig(num_hidden_layers=2, linear_num_key_heads=3, linear_num_value_heads=4)
    config.architectures = ["Qwen3_5ForCausalLM"]
    with pytest.raises(UnsupportedModelError, match="multiple"):
        read_model_config(config)


def test_qwen3_5_moe_reader_routes_every_layer() -> None:
    """Its config has no dense ``intermediate_size``: every layer is routed experts."""
    from transformers import Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(num_hidden_layers=4, norm_topk_prob=False)
    config.architectures = ["Qwen3_5MoeForCausalLM"]
    assert not hasattr(config, "intermediate_size")
    ours = read_model_config(config)
    assert ours.moe is not None and ours.moe.norm_topk_prob  # its router always renormalises
    assert all(ours.moe.is_sparse(i) for i in range(4))
    assert ours.linear_attention is not None and not ours.linear_attention.fused_projections


@pytest.mark.parametrize("family", sorted(VISION_LANGUAGE))
def test_released_vision_language_checkpoint_serves_its_text_model(family: str) -> None:
    """``model.language_model.*`` loads as the text model, the vision tower is left out, and
    a text prompt's logits equal the vision-language model's."""
    hf, ours = make_vision_language_pair(family)
    prompt = _prompt(40, seed=6)
    runner = HybridRunner(ours)
    runner.add_sequence()
    torch.testing.assert_close(runner.step([prompt]), _hf_logits(hf, prompt), atol=ATOL, rtol=1e-4)
