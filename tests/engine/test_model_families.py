"""Each family served by the shared Llama decoder beyond Llama, Mistral and Qwen2
(Qwen3, Qwen3-MoE, Phi-3, OLMo 2, Granite, SmolLM3), exact against transformers on a
tiny random checkpoint saved as safetensors and loaded through our loader:

- last-position logits of a prompt within fp32 tolerance of HF's;
- through the engine (CPU kernels prepared, as served): greedy tokens identical to HF
  ``generate`` for prompts of 5 to 230 tokens, one request at a time and all in one
  batch, and a prompt sharing 160 tokens with an earlier one hits the prefix cache
  and still decodes HF's tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_loader import load_model
from tests.engine.engine_fixtures import greedy, run_to_completion
from tests.support.fakes import PagedSequenceRunner
from tests.support.families import FAMILIES, make_family_model_dir

PROMPT_LENGTHS = (5, 37, 120, 230)
NEW_TOKENS = 8
SHARED = 160


@dataclass
class Family:
    path: str
    loaded: tuple[Any, Any, Any]
    hf: torch.nn.Module
    prompts: list[list[int]]

    def engine(self, **overrides: Any) -> LLMEngine:
        config = EngineConfig(
            model=self.path,
            device="cpu",
            **{"num_kv_blocks": 128, "max_num_batched_tokens": 1024, "max_num_seqs": 8, **overrides},
        )
        return LLMEngine(config, loaded=self.loaded)

    def hf_greedy(self, ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = self.hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
        return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    from transformers import AutoModelForCausalLM

    name = request.param
    path = make_family_model_dir(tmp_path_factory.mktemp("families") / name, name, seed=7)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # fixed-length greedy runs
    hf.generation_config.pad_token_id = 0
    rng = random.Random(name)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in PROMPT_LENGTHS]
    return Family(str(path), load_model(path, device="cpu"), hf, prompts)


def test_logits_match_hf(family: Family) -> None:
    """Before any engine packs the weights: the plain PyTorch path of every layer kind."""
    model = family.loaded[0]
    prompt = family.prompts[-1]
    runner = PagedSequenceRunner(model, num_blocks=32, block_size=16, shuffle=True)
    runner.add_sequence()
    ours = runner.step([prompt])[-1]
    with torch.no_grad():
        theirs = family.hf(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_greedy_tokens_match_hf_one_at_a_time_and_batched(family: Family) -> None:
    expected = [family.hf_greedy(p) for p in family.prompts]
    engine = family.engine(enable_prefix_caching=False)
    alone = [run_to_completion(engine, [p], greedy(NEW_TOKENS))[0].token_ids for p in family.prompts]
    assert alone == expected
    batched = run_to_completion(
        family.engine(enable_prefix_caching=False), family.prompts, greedy(NEW_TOKENS)
    )
    assert [out.token_ids for out in batched] == expected


def test_prefix_cache_hit_keeps_tokens(family: Family) -> None:
    first = family.prompts[-1]
    rng = random.Random(1)
    second = first[:SHARED] + [rng.randrange(100, 40000) for _ in range(40)]
    engine = family.engine(enable_prefix_caching=True)
    run_to_completion(engine, [first], greedy(NEW_TOKENS))
    out = run_to_completion(engine, [second], greedy(NEW_TOKENS))[0]
    assert out.num_cached_tokens > 0
    assert out.num_cached_tokens <= SHARED
    assert out.token_ids == family.hf_greedy(second)
