"""logit_bias, min_tokens, prompt logprobs and max_tokens=0 in the engine, against HF's
logits on the same tiny random model."""

from __future__ import annotations

import pytest
import torch

from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion


def hf_logprobs(tiny, ids: list[int]) -> torch.Tensor:
    """HF's log-softmax at every position of ``ids`` ([len, vocab])."""
    with torch.no_grad():
        logits = tiny.hf(torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(dim=-1)


def test_logit_bias_bans_and_forces_tokens(tiny):
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=3)[0]
    plain = run_to_completion(engine, [prompt], greedy(6))[0].token_ids
    banned = {t: -100.0 for t in set(plain)}
    biased = run_to_completion(engine, [prompt], greedy(6, logit_bias=banned))[0].token_ids
    assert not set(biased) & set(plain), (plain, biased)
    forced = run_to_completion(engine, [prompt], greedy(4, logit_bias={1234: 100.0}))[0].token_ids
    assert forced == [1234] * 4


def test_logit_bias_rows_do_not_leak_into_others(tiny):
    """One batch: a biased row and plain rows; the plain rows keep HF's greedy tokens."""
    engine = tiny.engine()
    prompts = random_prompts(tiny.tokenizer, 3, seed=4)
    params = [greedy(5), greedy(5, logit_bias={77: 100.0}), greedy(5)]
    outs = run_to_completion(engine, prompts, params)
    assert outs[1].token_ids == [77] * 5
    for i in (0, 2):
        assert outs[i].token_ids == tiny.hf_greedy(prompts[i], 5)


def test_min_tokens_masks_eos_until_reached(tiny):
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=5)[0]
    eos = tiny.tokenizer.eos_token_ids[0]
    # EOS forced by the bias, held back by min_tokens for the first 3 tokens.
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3, logit_bias={eos: 100.0})
    out = run_to_completion(engine, [prompt], params)[0]
    assert len(out.token_ids) == 4 and out.token_ids[-1] == eos and eos not in out.token_ids[:3]
    assert out.finish_reason == "stop"


@pytest.mark.parametrize("chunk", [512, 7])  # whole prompt in one step; chunked prefill
def test_prompt_logprobs_match_hf(tiny, chunk):
    engine = tiny.engine(max_num_batched_tokens=chunk, max_num_seqs=4)
    prompts = random_prompts(tiny.tokenizer, 3, seed=6, min_len=10, max_len=30)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    outs = run_to_completion(engine, prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        ref = hf_logprobs(tiny, prompt)
        scores = out.prompt_logprobs
        assert scores is not None and len(scores) == len(prompt) and scores[0] is None
        for p in range(1, len(prompt)):
            entry = scores[p]
            assert entry[prompt[p]] == pytest.approx(ref[p - 1, prompt[p]].item(), abs=1e-4)
            top = ref[p - 1].topk(3)
            for tid, lp in zip(top.indices.tolist(), top.values.tolist(), strict=True):
                assert entry[tid] == pytest.approx(lp, abs=1e-4)
            assert len(entry) <= 4


def test_prompt_logprobs_bypass_the_prefix_cache(tiny):
    """The same prompt twice: the second run would be served from the prefix cache, which
    has no logits; it is recomputed and scored the same."""
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=7, min_len=60, max_len=60)[0]
    run_to_completion(engine, [prompt], greedy(1))  # caches the prompt's blocks
    out = run_to_completion(engine, [prompt], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0
    ref = hf_logprobs(tiny, prompt)
    assert [round(e[t], 4) for e, t in zip(out.prompt_logprobs[1:], prompt[1:], strict=True)] == [
        round(ref[p - 1, prompt[p]].item(), 4) for p in range(1, len(prompt))
    ]


def test_max_tokens_zero_generates_nothing(tiny):
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=8)[0]
    out = run_to_completion(engine, [prompt], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"
    assert len(out.prompt_logprobs) == len(prompt)
    assert not engine.has_unfinished()


def test_bad_logit_bias_is_refused():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={5: 101.0})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0})
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


def test_prompt_logprobs_bypass_the_disk_tier(tiny, tmp_path):
    """A prompt whose blocks sit on the disk tier (pushed out of the pool) is recomputed,
    not loaded: loaded blocks have no logits either."""
    from tests.engine.test_kv_tiers_engine import history_then_churn

    engine = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))
    _, turn2 = history_then_churn(tiny, engine, seed=40)
    request = engine.add_request(turn2, SamplingParams(max_tokens=0, prompt_logprobs=0), request_id="scored")
    while engine.has_unfinished():
        engine.step()
    assert request.num_cached_tokens == 0 == request.num_loaded_tokens
    scores = engine.request_output(request).prompt_logprobs
    ref = hf_logprobs(tiny, turn2)
    assert len(scores) == len(turn2) and scores[0] is None
    for p in range(1, len(turn2)):
        assert scores[p][turn2[p]] == pytest.approx(ref[p - 1, turn2[p]].item(), abs=1e-4)
    engine.close()
