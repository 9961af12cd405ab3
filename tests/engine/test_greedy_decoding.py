"""A minimal greedy loop over our model (paged cache, prefill then batched decode)
produces exactly the tokens of HF ``generate(do_sample=False)``."""

from __future__ import annotations

import pytest
import torch

from tests.engine.model_fixtures import LoadedPair
from tests.support.fakes import greedy_generate

PROMPTS = ["Once upon a time", "def fibonacci(n):", "Paris is the capital of"]


def hf_greedy(pair: LoadedPair, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = pair.hf.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("variant", ["llama", "qwen2", "mistral", "llama3-rope"])
@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "chunked-prefill"])
def test_tiny_greedy_matches_hf_generate(tiny_pair, variant: str, layout: str) -> None:
    pair = tiny_pair(variant)
    prompts = [pair.tokenizer.encode(p) for p in PROMPTS]
    ours = greedy_generate(
        pair.ours,
        prompts,
        max_new_tokens=12,
        block_size=4,
        shuffle=layout != "contiguous",
        prefill_chunk=3 if layout == "chunked-prefill" else None,
    )
    assert ours == [hf_greedy(pair, p, 12) for p in prompts]


@pytest.mark.slow
def test_smollm2_greedy_matches_hf_generate(smollm2_pair) -> None:
    tok = smollm2_pair.tokenizer
    prompts = [
        tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}]),
        tok.encode_chat([{"role": "user", "content": "Write a haiku about the sea."}]),
    ]
    ours = greedy_generate(smollm2_pair.ours, prompts, max_new_tokens=12, block_size=16, shuffle=True)
    assert ours == [hf_greedy(smollm2_pair, p, 12) for p in prompts]
    assert "Paris" in tok.decode(ours[0])
