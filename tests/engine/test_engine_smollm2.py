"""The engine on the real default model (SmolLM2-135M-Instruct): exact against HF
``generate`` while batched, and a real chat turn that ends on its own EOS."""

from __future__ import annotations

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import greedy, run_to_completion
from tests.engine.model_fixtures import LoadedPair

pytestmark = pytest.mark.slow
CHAT_PARAMS = SamplingParams(temperature=0, max_tokens=32)

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning Python.",
    "Explain photosynthesis to a child.",
]
RAW = [
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The three primary colours are",
    "import numpy as np\n\n",
]


def engine_on(pair: LoadedPair, **overrides: object) -> LLMEngine:
    config = EngineConfig(device="cpu", num_kv_blocks=256, **overrides)  # type: ignore[arg-type]
    return LLMEngine(config, loaded=(pair.ours, pair.tokenizer, pair.config))


def hf_greedy(pair: LoadedPair, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = pair.hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


def test_smollm2_batched_greedy_matches_hf_generate_for_chat_and_raw_prompts(
    smollm2_pair: LoadedPair,
) -> None:
    tok = smollm2_pair.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS] + [
        tok.encode(r) for r in RAW
    ]
    # All eight run together, prefill chunked, so batching and chunking are exercised too.
    outs = run_to_completion(engine_on(smollm2_pair, max_num_batched_tokens=64), prompts, greedy(20))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(smollm2_pair, prompt, 20), tok.decode(prompt)


def test_smollm2_chat_answer_ends_on_end_of_turn_and_turn_two_hits_the_cache(
    smollm2_pair: LoadedPair,
) -> None:
    tok = smollm2_pair.tokenizer
    engine = engine_on(smollm2_pair)
    history = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    first = run_to_completion(engine, [tok.encode_chat(history)], CHAT_PARAMS)[0]
    assert first.finish_reason == "stop" and "Paris" in first.text
    assert first.token_ids[-1] in tok.eos_token_ids and "<|im_end|>" not in first.text
    history += [
        {"role": "assistant", "content": first.text, "token_ids": first.token_ids},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = run_to_completion(engine, [tok.encode_chat(history)], CHAT_PARAMS)[0]
    bs = engine.block_manager.block_size
    assert second.num_cached_tokens == (len(first.prompt_token_ids) + len(first.token_ids) - 1) // bs * bs
    assert "Rome" in second.text
