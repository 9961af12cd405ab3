"""Our decoder's logits equal Hugging Face transformers' on the same weights (fp32).

Each check runs the paged path end to end: prefill of a whole prompt, and prefill
followed by single-token decode steps through a shuffled (non-contiguous) block
table, both compared with HF's full-sequence forward."""

from __future__ import annotations

import pytest
import torch

from tests.engine.model_fixtures import TINY_VARIANTS, LoadedPair
from tests.support.fakes import PagedSequenceRunner

TOL = 1e-3
PROMPT = "The quick brown fox jumps over the lazy dog. Paged attention keeps KV in blocks!"


def hf_log_probs(pair: LoadedPair, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return pair.hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (ours.log_softmax(-1) - ref).abs().max().item()
    assert diff < TOL, f"max |log p_ours - log p_hf| = {diff:.2e}"


def check_prefill(pair: LoadedPair, ids: list[int]) -> None:
    runner = PagedSequenceRunner(pair.ours, num_blocks=64, block_size=4, shuffle=True)
    runner.add_sequence()
    assert_close(runner.step([ids]), hf_log_probs(pair, ids))


def check_prefill_then_decode(pair: LoadedPair, ids: list[int], split: int) -> None:
    ref = hf_log_probs(pair, ids)
    runner = PagedSequenceRunner(pair.ours, num_blocks=64, block_size=4, shuffle=True, seed=1)
    runner.add_sequence()
    rows = [runner.step([ids[:split]])]
    rows += [runner.step([[tok]]) for tok in ids[split:]]
    assert runner.tables[0] != sorted(runner.tables[0]), "block table should be non-contiguous"
    assert_close(torch.cat(rows), ref)


@pytest.mark.parametrize("variant", list(TINY_VARIANTS))
def test_tiny_prefill_logits_match_hf(tiny_pair, variant: str) -> None:
    pair = tiny_pair(variant)
    check_prefill(pair, pair.tokenizer.encode(PROMPT))


@pytest.mark.parametrize("variant", list(TINY_VARIANTS))
def test_tiny_prefill_then_paged_decode_logits_match_hf(tiny_pair, variant: str) -> None:
    pair = tiny_pair(variant)
    check_prefill_then_decode(pair, pair.tokenizer.encode(PROMPT), split=5)


def test_llama3_rope_beyond_original_context_matches_hf(tiny_pair) -> None:
    """Positions past original_max_position_embeddings (64) use the scaled frequencies."""
    pair = tiny_pair("llama3-rope")
    ids = pair.tokenizer.encode(PROMPT * 8)[:150]
    assert len(ids) == 150
    check_prefill_then_decode(pair, ids, split=140)


def test_chunked_prefill_over_cached_prefix_matches_hf(tiny_pair) -> None:
    """A prompt fed in chunks attends over the blocks earlier chunks stored."""
    pair = tiny_pair("qwen2")
    ids = pair.tokenizer.encode(PROMPT)
    runner = PagedSequenceRunner(pair.ours, num_blocks=64, block_size=4, shuffle=True, seed=2)
    runner.add_sequence()
    rows = [runner.step([ids[i : i + 7]]) for i in range(0, len(ids), 7)]
    assert_close(torch.cat(rows), hf_log_probs(pair, ids))


def test_mixed_batch_of_sequences_matches_hf_per_sequence(tiny_pair) -> None:
    """Several sequences of different lengths packed in one step (prefill and decode
    mixed, then decode-only steps) each match HF's forward on that sequence alone."""
    pair = tiny_pair("llama")
    prompts = [pair.tokenizer.encode(t) for t in (PROMPT, "Hi", "Blocks of sixteen tokens each, shuffled.")]
    runner = PagedSequenceRunner(pair.ours, num_blocks=64, block_size=4, shuffle=True, seed=3)
    for _ in prompts:
        runner.add_sequence()
    # Step 1: prompt 0 fully, prompt 1 fully, prompt 2 only its first 3 tokens.
    first = runner.step([prompts[0], prompts[1], prompts[2][:3]])
    # Step 2: one token each for 0 and 1 (decode), rest of prompt 2 (prefill) -> mixed step.
    cont = [[11], [12]]
    second = runner.step([cont[0], cont[1], prompts[2][3:]])
    # Step 3: decode-only for all three.
    third = runner.step([[13], [14], [15]])
    full = [prompts[0] + [11, 13], prompts[1] + [12, 14], prompts[2] + [15]]
    refs = [hf_log_probs(pair, f) for f in full]
    n0, n1 = len(prompts[0]), len(prompts[1])
    assert_close(first[:n0], refs[0][:n0])
    assert_close(first[n0 : n0 + n1], refs[1][:n1])
    assert_close(first[n0 + n1 :], refs[2][:3])
    assert_close(second[0:1], refs[0][n0 : n0 + 1])
    assert_close(second[1:2], refs[1][n1 : n1 + 1])
    assert_close(second[2:], refs[2][3 : len(prompts[2])])
    assert_close(third, torch.stack([refs[0][-1], refs[1][-1], refs[2][-1]]))


@pytest.mark.slow
def test_smollm2_prefill_logits_match_hf(smollm2_pair) -> None:
    ids = smollm2_pair.tokenizer.encode_chat([{"role": "user", "content": "Name a colour."}])
    check_prefill(smollm2_pair, ids)


@pytest.mark.slow
def test_smollm2_prefill_then_paged_decode_logits_match_hf(smollm2_pair) -> None:
    ids = smollm2_pair.tokenizer.encode_chat([{"role": "user", "content": "Name a colour."}])
    check_prefill_then_decode(smollm2_pair, ids, split=len(ids) - 6)
