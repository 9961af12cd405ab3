"""The sliding-window families against transformers on tiny random checkpoints:
``MistralForCausalLM`` (every layer slides, window 32), ``Gemma3ForCausalLM`` (3 sliding :
1 full), ``Gemma2ForCausalLM`` and ``GptOssForCausalLM`` (sinks, alternating layers, 8
experts, MXFP4 experts). Prompts of 5 to 230 tokens run past every window; greedy tokens
must equal HF ``generate``, one prompt at a time and as one batch, with a prefix hit on
a prompt sharing 160 tokens with an earlier one; the first token's log-probabilities
must equal HF's within fp32 tolerance."""

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
from tests.support.sliding_models import WINDOW, load_reference, make_sliding_model_dir

NEW_TOKENS = 5
SHARED = 160  # tokens the last prompt shares with the 230-token one (10 blocks of 16)


@dataclass
class Family:
    path: str
    loaded: tuple[Any, Any, Any]
    hf: Any
    prompts: list[list[int]]
    expected: list[list[int]]
    first_logprobs: torch.Tensor  # HF's log-softmax at the end of the 230-token prompt

    def engine(self) -> LLMEngine:
        config = EngineConfig(
            model=self.path,
            device="cpu",
            num_kv_blocks=512,
            block_size=16,
            max_num_batched_tokens=512,
            max_num_seqs=16,
        )
        return LLMEngine(config, loaded=self.loaded)


def _prompts() -> list[list[int]]:
    rng = random.Random(44)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 33, 70, 230)]
    prompts.append(prompts[3][:SHARED] + [rng.randrange(100, 40000) for _ in range(37)])
    return prompts


@pytest.fixture(scope="module", params=["mistral", "gemma3", "gemma2", "gpt_oss"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    name = request.param
    path = make_sliding_model_dir(tmp_path_factory.mktemp("sliding") / name, name, seed=7)
    hf = load_reference(path, name)
    prompts = _prompts()
    expected = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
            expected.append(out[0, len(p) :].tolist())
        first = torch.log_softmax(hf(torch.tensor([prompts[3]])).logits[0, -1].float(), dim=-1)
    return Family(str(path), load_model(path, device="cpu"), hf, prompts, expected, first)


def test_the_model_has_sliding_layers_and_no_context_cap(family: Family) -> None:
    model, _, config = family.loaded
    windows = model.kv_spec.windows
    assert windows is not None and WINDOW in windows
    assert config.max_model_len == config.max_position_embeddings > WINDOW


def test_greedy_equals_transformers_one_at_a_time_with_a_prefix_hit(family: Family) -> None:
    engine = family.engine()
    got, cached = [], []
    for prompt in family.prompts:
        (out,) = run_to_completion(engine, [prompt], greedy(NEW_TOKENS))
        got.append(out.outputs[0].token_ids)
        cached.append(out.num_cached_tokens)
    assert got == family.expected
    assert cached[-1] == SHARED  # the shared prefix came from the cache
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_greedy_and_logprobs_equal_transformers_as_one_batch(family: Family) -> None:
    engine = family.engine()
    outs = run_to_completion(engine, family.prompts, greedy(NEW_TOKENS, logprobs=5))
    assert [o.outputs[0].token_ids for o in outs] == family.expected
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # The first token after 230 tokens (past every window): fp32 log-probabilities.
    for token, logprob in outs[3].outputs[0].logprobs[0].items():
        assert logprob == pytest.approx(family.first_logprobs[token].item(), abs=1e-4)
