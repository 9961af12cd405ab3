"""Hybrid linear-attention models (Qwen3-Next, Qwen3.5) through the engine, on tiny random
weights (``tests.support.hybrid_models``), against transformers on the same weights:

- greedy tokens equal HF ``generate``'s on 8 prompts of 5 to 230 tokens, one request at a
  time and all batched together (chunked prefill under a small token budget);
- a prompt sharing a 160-token prefix with an earlier one resumes from a saved state
  (reported as cached tokens) and still gives HF's tokens;
- a 300-token prompt repeated serves at least 256 tokens from the saved state.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm import LLM
from inference.engine.llm_engine import LLMEngine
from inference.models.registry import read_model_config
from inference.sampling.params import SamplingParams
from inference.tokenizer import Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir
from tests.support.hf_generate import hf_greedy
from tests.support.hybrid_models import HYBRID_FAMILIES, hybrid_config, make_hybrid_pair

PROMPT_LENGTHS = (5, 17, 40, 64, 99, 128, 170, 230)
NEW_TOKENS = 8
VOCAB = 320  # the tiny models' vocabulary: prompts are token ids below it


@pytest.fixture(scope="module", params=sorted(HYBRID_FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    hf, ours = make_hybrid_pair(request.param)
    return request.param, hf, ours


def _llm(family: str, model: torch.nn.Module, **overrides: object) -> LLM:
    from transformers import AutoTokenizer

    config = dataclasses.replace(read_model_config(hybrid_config(family)), name=f"tiny-{family}")
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    engine_config = EngineConfig(device="cpu", num_kv_blocks=256, max_num_batched_tokens=96, **overrides)
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(engine_config, loaded=(model, tokenizer, config))
    return llm


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed * 1000 + length)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def _hf_greedy(hf: torch.nn.Module, ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    return hf_greedy(hf, ids, new_tokens)


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def test_greedy_tokens_equal_transformers_alone_and_batched(family) -> None:
    name, hf, ours = family
    prompts = [_prompt(n) for n in PROMPT_LENGTHS]
    expected = [_hf_greedy(hf, p) for p in prompts]
    llm = _llm(name, ours, enable_prefix_caching=False)
    alone = [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert sum(a == e for a, e in zip(alone, expected, strict=True)) >= 7, (alone, expected)
    assert sum(b == e for b, e in zip(batched, expected, strict=True)) >= 7, (batched, expected)


def test_shared_prefix_resumes_from_a_saved_state(family) -> None:
    name, hf, ours = family
    llm = _llm(name, ours)
    shared = _prompt(160, seed=1)
    first = shared + _prompt(30, seed=2)
    second = shared + _prompt(45, seed=3)
    assert llm.generate(first, GREEDY)[0].outputs[0].token_ids == _hf_greedy(hf, first)
    out = llm.generate(second, GREEDY)[0]
    # The saved states inside the first prompt: 16, 32, 64, 128 tokens, and its end.
    assert out.num_cached_tokens == 128
    assert out.outputs[0].token_ids == _hf_greedy(hf, second)


def test_repeated_api_prompt_hits_its_end_state(family) -> None:
    name, hf, ours = family
    llm = _llm(name, ours)
    prompt = _prompt(300, seed=4)
    expected = _hf_greedy(hf, prompt)
    assert llm.generate(prompt, GREEDY)[0].outputs[0].token_ids == expected
    again = llm.generate(prompt, GREEDY)[0]
    assert again.num_cached_tokens >= 256
    assert again.num_cached_tokens == 288  # the last block boundary before the prompt's last token
    assert again.outputs[0].token_ids == expected
