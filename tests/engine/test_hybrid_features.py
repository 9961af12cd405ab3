"""The engine's other features on a hybrid model (tiny random Qwen3.5, checked against
transformers on the same weights; structured output on ``tests.support.recurrent_model``,
whose vocabulary is the tokenizer's):

- n > 1: every completion forks the prompt's state and equals HF's greedy tokens;
- beam search: each returned beam's cumulative logprob is HF's for those tokens (a beam
  continuing from a wrong state would score differently);
- speculative decoding (n-gram, and a plain draft model): accepted and rejected
  proposals, the state rolled back on each rejection, HF's greedy tokens;
- preemption in a pool too small for every request: recomputed, same tokens;
- structured output: the choice grammar's text, and the dense reference's tokens when
  the grammar allows exactly the model's greedy choice;
- a chat's next turn resumes from the state saved at the end of the answer.

Prefill workers on a hybrid model: ``tests/engine/test_hybrid_pd.py``.
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
from inference.structured import GrammarSpec
from inference.tokenizer import Tokenizer
from tests.support.fakes import make_tiny_model_dir, smollm2_tokenizer_dir
from tests.support.hf_generate import hf_greedy
from tests.support.hybrid_models import hybrid_config, make_hybrid_pair
from tests.support.recurrent_model import tiny_hybrid_model

FAMILY = "qwen3_5"
VOCAB = 320


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return make_hybrid_pair(FAMILY)


def _llm(model: torch.nn.Module, **overrides: object) -> LLM:
    from transformers import AutoTokenizer

    config = dataclasses.replace(read_model_config(hybrid_config(FAMILY)), name="tiny-qwen3_5")
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    settings = {"device": "cpu", "num_kv_blocks": 128, "max_num_batched_tokens": 64, **overrides}
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(EngineConfig(**settings), loaded=(model, tokenizer, config))  # type: ignore[arg-type]
    return llm


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def _hf_greedy(hf: torch.nn.Module, ids: list[int], new_tokens: int) -> list[int]:
    return hf_greedy(hf, ids, new_tokens)


def _hf_logprob(hf: torch.nn.Module, prompt: list[int], completion: list[int]) -> float:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return float(logprobs[torch.arange(len(completion)), torch.tensor(completion)].sum())


def test_parallel_completions_fork_the_state(pair) -> None:
    hf, ours = pair
    llm = _llm(ours)
    prompt = _prompt(70, seed=1)
    out = llm.generate(prompt, SamplingParams(n=2, max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    expected = _hf_greedy(hf, prompt, 8)
    assert [c.token_ids for c in out.outputs] == [expected, expected]


def test_beams_score_as_transformers(pair) -> None:
    hf, ours = pair
    llm = _llm(ours)
    prompt = _prompt(40, seed=2)
    params = SamplingParams(n=2, use_beam_search=True, temperature=0.0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompt, params)[0]
    assert len(out.outputs) == 2 and out.outputs[0].token_ids != out.outputs[1].token_ids
    for completion in out.outputs:
        assert completion.cumulative_logprob == pytest.approx(
            _hf_logprob(hf, prompt, completion.token_ids), abs=1e-3
        )


def test_speculative_decoding_rolls_the_state_back(pair) -> None:
    """Repetitive prompts, so the n-gram speculator proposes: some proposals are accepted,
    some rejected (each rejection restores the state from before its verify step and
    recomputes the accepted tokens), and every token is still HF's."""
    hf, ours = pair
    llm = _llm(ours, speculative="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=2)
    prompts = []
    for seed in (3, 4):
        start = _prompt(30, seed=seed)
        prompts.append(start + _hf_greedy(hf, start, 12) + start)
    prompts.append(_prompt(12, seed=5) * 4)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [_hf_greedy(hf, p, 16) for p in prompts]
    stats = llm.engine.speculator.stats
    assert stats.accepted_tokens > 0 and stats.rejected_tokens > 0 and stats.rollbacks > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm._verifying
    assert bm.states.num_used == len(bm.saved)  # every snapshot slot went back


def test_a_draft_model_speculates_on_a_hybrid_target(pair, tmp_path) -> None:
    """A plain tiny Llama with the hybrid's vocabulary drafts; its proposals that the
    target rejects roll the target's state back, and the tokens stay HF's."""
    hf, ours = pair
    draft = make_tiny_model_dir(tmp_path / "draft", "llama", seed=3, vocab_size=VOCAB)
    llm = _llm(ours, speculative=f"draft:{draft}", num_speculative_tokens=3)
    prompts = [_prompt(40, seed=6), _prompt(25, seed=7)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [_hf_greedy(hf, p, 12) for p in prompts]
    stats = llm.engine.speculator.stats
    assert stats.verifications > 0 and stats.rollbacks > 0


def test_preempted_requests_recompute_their_state(pair) -> None:
    hf, ours = pair
    llm = _llm(ours, num_kv_blocks=12, max_num_batched_tokens=256, enable_prefix_caching=False)
    prompts = [_prompt(50, seed=10 + i) for i in range(3)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [_hf_greedy(hf, p, 24) for p in prompts]


def test_structured_output_on_a_hybrid_model() -> None:
    model, tokenizer, config = tiny_hybrid_model()
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(
        EngineConfig(device="cpu", num_kv_blocks=64, max_num_batched_tokens=64),
        loaded=(model, tokenizer, config),
    )
    prompt = tokenizer.encode("Pick one of the words, please:")
    free = model.reference_generate(prompt, 1)[0]
    word = tokenizer.decode([free])
    choices = [word, "zebra crossing", "quantum"]
    params = SamplingParams(max_tokens=8, temperature=0.0, grammar=GrammarSpec.choice(choices))
    out = llm.generate(prompt, params)[0].outputs[0]
    assert out.text in choices
    assert out.token_ids[0] == free  # the grammar allowed the model's own greedy first token


def test_next_turn_resumes_at_the_end_of_the_answer(pair) -> None:
    """A chat's next prompt is the history and the answer plus a new message: the state
    saved while the answer was decoded serves everything up to its last block boundary."""
    hf, ours = pair
    llm = _llm(ours)
    prompt = _prompt(50, seed=20)
    answer = llm.generate(prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    history = prompt + answer.outputs[0].token_ids
    turn = history + _prompt(9, seed=21)
    out = llm.generate(turn, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    assert out.num_cached_tokens == ((len(history) - 1) // 16) * 16 == 64
    assert out.outputs[0].token_ids == _hf_greedy(hf, turn, 6)
