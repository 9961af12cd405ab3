"""A float16 KV pool (``EngineConfig.kv_cache_dtype``, ``inference.kv.kv_dtype``).

What it promises: twice the blocks in the same memory; answers that do not depend on
whether a prefix was computed, found cached, swapped out or read back from disk (every
attention reads K/V as the pool holds them, a fresh prompt's own chunk included); and on
the real default model, logits within a stated bound of the fp32 pool's, with the same
greedy answers except where fp32's own choice is within that bound of a tie."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.config import EngineConfig
from inference.kv.kv_dtype import resolve_kv_dtype
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion
from tests.engine.model_fixtures import LoadedPair
from tests.engine.test_engine_smollm2 import CHATS, RAW
from tests.engine.test_kv_tiers_engine import assert_nothing_leaked
from tests.support.fakes import PagedSequenceRunner

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
NEW_TOKENS = 20
# Largest |logit| difference from the fp32 pool over the teacher-forced decode steps below
# (measured worst 0.023 over 8 prompts x 20 tokens: each K/V value keeps 11 significant
# bits; the sums stay fp32).
LOGIT_TOL = 0.1
NEAR_TIE = 2 * LOGIT_TOL


def test_each_choice_resolves_per_device_and_a_bad_one_is_refused() -> None:
    assert resolve_kv_dtype("model", CPU, torch.float32) == torch.float32
    assert resolve_kv_dtype("float16", CPU, torch.float32) == torch.float16
    assert resolve_kv_dtype("auto", CPU, torch.float32) == torch.float16
    assert resolve_kv_dtype("auto", CUDA, torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("float16", CUDA, torch.float16) == torch.float16
    with pytest.raises(ValueError, match="needs a float16 model"):
        resolve_kv_dtype("float16", CUDA, torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        resolve_kv_dtype("fp8", CPU, torch.float32)
    with pytest.raises(ValueError, match="EngineConfig.kv_cache_dtype must be one of model, float16, auto"):
        EngineConfig(kv_cache_dtype="int8")


def test_a_float16_pool_holds_twice_the_blocks_in_the_same_memory(tiny: TinyModel) -> None:
    sizes = {}
    for choice in ("model", "float16"):
        engine = tiny.engine(num_kv_blocks=None, kv_cache_gb=0.002, kv_cache_dtype=choice)
        sizes[choice] = (engine.runner.kv_cache.dtype, engine.block_manager.num_blocks)
        engine.close()
    assert sizes["model"][0] == torch.float32 and sizes["float16"][0] == torch.float16
    assert sizes["float16"][1] == 2 * sizes["model"][1]


def test_answers_do_not_depend_on_where_the_prefix_came_from(tiny: TinyModel, tmp_path: Path) -> None:
    prompts = random_prompts(tiny.tokenizer, 6, seed=7, min_len=30, max_len=45)
    prompts[3] = prompts[0][:32] + prompts[3]  # a shared history
    computed = run_to_completion(
        tiny.engine(kv_cache_dtype="float16", enable_prefix_caching=False), prompts, greedy(30)
    )
    warm = tiny.engine(kv_cache_dtype="float16")
    cached = run_to_completion(warm, prompts[:3], greedy(30))
    cached += run_to_completion(warm, prompts[3:], greedy(30))  # the fourth finds the first's history
    assert cached[3].num_cached_tokens >= 32
    tight = tiny.engine(kv_cache_dtype="float16", num_kv_blocks=12, kv_disk_dir=str(tmp_path))
    swapped = run_to_completion(tight, prompts, greedy(30))
    assert tight.stats().num_swaps > 0 and tight.tiers.counters.loaded_blocks > 0
    expected = [o.token_ids for o in computed]
    assert [o.token_ids for o in cached] == expected
    assert [o.token_ids for o in swapped] == expected
    again = run_to_completion(tight, prompts[:2], greedy(30))  # their prefixes now read back from disk
    assert all(o.num_cached_tokens > 0 for o in again)
    assert [o.token_ids for o in again] == expected[:2]
    assert_nothing_leaked(tight)
    tight.close()


def decode_logits(
    pair: LoadedPair, prompt: list[int], answer: list[int], kv_dtype: torch.dtype
) -> torch.Tensor:
    """The logits of each answer token's step: the prompt as one chunk, then the answer
    one token a step (decode steps, which read every earlier K/V from the pool)."""
    runner = PagedSequenceRunner(pair.ours, num_blocks=64, block_size=16, shuffle=True, kv_dtype=kv_dtype)
    runner.add_sequence()
    rows = [runner.step([prompt])[-1]]
    rows += [runner.step([[token]])[-1] for token in answer[:-1]]
    return torch.stack(rows)


@pytest.mark.slow
def test_smollm2_logits_stay_near_the_fp32_pools_and_greedy_answers_agree_but_at_near_ties(
    smollm2_pair: LoadedPair,
) -> None:
    pair = smollm2_pair
    tok = pair.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS] + [
        tok.encode(r) for r in RAW
    ]
    answers = {}
    for choice in ("model", "float16"):
        config = EngineConfig(
            device="cpu", num_kv_blocks=256, max_num_batched_tokens=64, kv_cache_dtype=choice
        )
        from inference.engine.llm_engine import LLMEngine  # noqa: PLC0415 - beside its only use

        engine = LLMEngine(config, loaded=(pair.ours, pair.tokenizer, pair.config))
        answers[choice] = [o.token_ids for o in run_to_completion(engine, prompts, greedy(NEW_TOKENS))]
        engine.close()
    worst = 0.0
    for prompt, fp32, fp16 in zip(prompts, answers["model"], answers["float16"], strict=True):
        exact = decode_logits(pair, prompt, fp32, torch.float32)
        rounded = decode_logits(pair, prompt, fp32, torch.float16)
        worst = max(worst, (exact - rounded).abs().max().item())
        if fp32 != fp16:
            at = next(i for i, (a, b) in enumerate(zip(fp32, fp16, strict=True)) if a != b)
            margin = (exact[at, fp32[at]] - exact[at, fp16[at]]).item()
            assert 0 <= margin < NEAR_TIE, (
                f"answers part at token {at} where fp32 preferred its token by {margin:.3f}"
            )
    assert 0 < worst < LOGIT_TOL, f"max |logit float16 pool - logit fp32 pool| = {worst:.3f}"
    identical = sum(a == b for a, b in zip(answers["model"], answers["float16"], strict=True))
    assert identical >= len(prompts) - 1, f"only {identical} of {len(prompts)} answers agree"


def test_float16_history_converts_to_bfloat16_through_fp32_with_the_same_bits() -> None:
    from inference.layers.attention import _converted  # noqa: PLC0415 - the one private helper tested

    halves = (
        torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    )  # every half
    direct, widened = halves.to(torch.bfloat16), _converted(halves, torch.bfloat16)
    same = (direct.view(torch.int16) == widened.view(torch.int16)) | (direct.isnan() & widened.isnan())
    assert bool(same.all())
    finite = halves[halves.isfinite()]
    assert _converted(finite, torch.float32).equal(finite.float())


def test_prefill_workers_ship_float16_blocks_that_answer_as_the_local_pool_does(tiny: TinyModel) -> None:
    prompts = random_prompts(tiny.tokenizer, 3, seed=12, min_len=150, max_len=300)
    local = run_to_completion(tiny.engine(kv_cache_dtype="float16"), prompts, greedy(10))
    engine = tiny.engine(
        kv_cache_dtype="float16", prefill_workers=1, pd_affinity="off", pd_min_prompt_tokens=64
    )
    try:
        assert engine.scheduler.workers.wait_ready(180.0), "the prefill worker did not start"
        shipped = run_to_completion(engine, prompts, greedy(10))
        stats = engine.scheduler.disaggregation_stats()
        assert stats["imported_requests"] == len(prompts) and stats["fallbacks_total"] == 0
        assert engine.runner.kv_cache.dtype == torch.float16
        assert [o.token_ids for o in shipped] == [o.token_ids for o in local]
    finally:
        engine.close()
