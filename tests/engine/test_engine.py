"""The engine end to end on a tiny random-weight Llama: exactness against HF, batch
invariance, prefix caching across turns, preemption, abort and limits."""

from __future__ import annotations

import random

import pytest

from inference.errors import EngineOverloadedError, PromptTooLongError
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion

CHAT = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "user", "content": "2+2=?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "×3?"},
    ],
]
RAW = ["Once upon a time", "def fibonacci(n):", "The quick brown fox", "Paris is the capital of"]


def test_greedy_matches_hf_generate_for_chat_and_raw_prompts(tiny: TinyModel) -> None:
    tok = tiny.tokenizer
    prompts = [tok.encode_chat(c) for c in CHAT] + [tok.encode(t) for t in RAW]
    outs = run_to_completion(tiny.engine(), prompts, greedy(12))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == tiny.hf_greedy(prompt, 12)
        assert out.finish_reason == "length"


def test_string_prompts_are_tokenised_like_the_tokenizer(tiny: TinyModel) -> None:
    engine = tiny.engine()
    out = run_to_completion(engine, [RAW[0]], greedy(4))[0]
    assert out.prompt_token_ids == tiny.tokenizer.encode(RAW[0])
    assert out.text == tiny.tokenizer.decode(out.token_ids)


@pytest.mark.parametrize(
    ("chunk", "caching"),
    [(512, True), (7, True), (7, False)],
    ids=["whole-prefill", "chunked-prefill-cached", "chunked-prefill-uncached"],
)
def test_greedy_output_is_the_same_alone_and_among_16_others_arriving_at_random_steps(
    tiny: TinyModel, chunk: int, caching: bool
) -> None:
    prompts = random_prompts(tiny.tokenizer, 17, seed=1)
    prompts[5] = prompts[0][:40] + prompts[5]  # shared prefixes give the cache work
    prompts[9] = prompts[0][:33] + prompts[9]
    alone = run_to_completion(tiny.engine(), [prompts[0]], greedy(20))[0].token_ids
    rng = random.Random(2)
    arrivals = [0] + [rng.randrange(0, 30) for _ in range(16)]
    engine = tiny.engine(max_num_batched_tokens=chunk, enable_prefix_caching=caching)
    together = run_to_completion(
        engine, prompts, [greedy(20)] + [greedy(rng.randint(3, 25)) for _ in range(16)], arrivals
    )
    assert together[0].token_ids == alone
    for prompt, out in zip(prompts[1:], together[1:], strict=True):
        alone_i = run_to_completion(tiny.engine(), [prompt], greedy(len(out.token_ids)))[0]
        assert out.token_ids == alone_i.token_ids
    assert engine.block_manager.stats().used == 0


def test_decode_and_prefill_chunks_share_a_step(tiny: TinyModel) -> None:
    engine = tiny.engine(max_num_batched_tokens=16)
    engine.add_request(random_prompts(tiny.tokenizer, 1, 3, 10, 10)[0], greedy(30))
    for _ in range(3):
        engine.step()
    engine.add_request(random_prompts(tiny.tokenizer, 1, 4, 50, 50)[0], greedy(5))
    batch = engine.scheduler.schedule()
    assert sorted(batch.num_new_tokens) == [1, 15]  # one decode + a 15-token prefill chunk


def test_second_turn_reuses_the_first_turns_blocks_and_matches_an_uncached_run(tiny: TinyModel) -> None:
    tok = tiny.tokenizer
    engine = tiny.engine()
    bs = engine.block_manager.block_size
    history = [{"role": "user", "content": "Tell me a story about a lighthouse keeper and a storm."}]
    turn1_prompt = tok.encode_chat(history)
    turn1 = run_to_completion(engine, [turn1_prompt], greedy(40))[0]
    history += [
        {"role": "assistant", "content": turn1.text, "token_ids": turn1.token_ids},
        {"role": "user", "content": "And then what happened?"},
    ]
    turn2_prompt = tok.encode_chat(history)
    turn1_ids = turn1_prompt + turn1.token_ids
    assert turn2_prompt[: len(turn1_ids)] == turn1_ids
    turn2 = run_to_completion(engine, [turn2_prompt], greedy(20))[0]
    # Everything turn 1 computed (all but its last sampled token) in full blocks is reused.
    assert turn2.num_cached_tokens == (len(turn1_ids) - 1) // bs * bs
    assert turn2.num_cached_tokens >= 0.8 * len(turn1_ids)
    uncached = run_to_completion(tiny.engine(enable_prefix_caching=False), [turn2_prompt], greedy(20))[0]
    assert uncached.num_cached_tokens == 0
    assert turn2.token_ids == uncached.token_ids


def test_an_edited_branch_shares_exactly_the_blocks_of_the_common_prefix(tiny: TinyModel) -> None:
    tok = tiny.tokenizer
    engine = tiny.engine()
    bs = engine.block_manager.block_size
    base = [
        {"role": "system", "content": "You are a helpful assistant who answers in detail."},
        {"role": "user", "content": "What should I pack for a week of hiking in the Alps in June?"},
        {"role": "assistant", "content": "Layers, a rain jacket, sturdy boots, sun cream and a map."},
    ]
    original = tok.encode_chat(base + [{"role": "user", "content": "What about food for the trail?"}])
    edited = tok.encode_chat(base + [{"role": "user", "content": "Which huts take reservations?"}])
    common = next(i for i, (a, b) in enumerate(zip(original, edited, strict=True)) if a != b)
    first = engine.add_request(original, greedy(4))
    engine.step()  # prefill: the whole original prompt is now in blocks
    original_table = list(first.seqs[0].block_table)
    while engine.has_unfinished():
        engine.step()
    second = engine.add_request(edited, greedy(4))
    engine.step()
    assert 0 < common // bs < len(original) // bs
    assert second.num_cached_tokens == common // bs * bs
    table = second.seqs[0].block_table
    assert table[: common // bs] == original_table[: common // bs]
    # The original's later full blocks stay cached but unshared (they hold other tokens).
    later = original_table[common // bs : len(original) // bs]
    assert later and not set(table) & set(later)
    assert all(engine.block_manager.blocks[b].hash is not None for b in later)
    while engine.has_unfinished():
        engine.step()


def test_a_pool_too_small_for_all_requests_preempts_and_still_gives_the_same_outputs(tiny: TinyModel) -> None:
    prompts = random_prompts(tiny.tokenizer, 6, seed=7, min_len=30, max_len=45)
    roomy = run_to_completion(tiny.engine(), prompts, greedy(40))
    engine = tiny.engine(num_kv_blocks=14)  # each request needs ~5 blocks of 16; 6 need ~30
    tight = run_to_completion(engine, prompts, greedy(40))
    assert engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    assert engine.block_manager.stats().used == 0


def test_forked_requests_survive_preemption_with_unchanged_outputs(tiny: TinyModel) -> None:
    prompts = random_prompts(tiny.tokenizer, 4, seed=18, min_len=30, max_len=40)
    params = [
        greedy(30, n=2),
        SamplingParams(use_beam_search=True, beam_width=2, max_tokens=30, ignore_eos=True, temperature=0),
        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=30, ignore_eos=True),
        greedy(30),
    ]
    roomy = run_to_completion(tiny.engine(), prompts, params)
    engine = tiny.engine(num_kv_blocks=16, max_num_batched_tokens=24)
    tight = run_to_completion(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for a, b in zip(roomy, tight, strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert engine.block_manager.stats().used == 0


def test_abort_mid_decode_frees_the_blocks_and_the_others_continue(tiny: TinyModel) -> None:
    engine = tiny.engine()
    prompts = random_prompts(tiny.tokenizer, 2, seed=8, min_len=40, max_len=40)
    engine.add_request(prompts[0], greedy(30), request_id="keep")
    engine.add_request(prompts[1], greedy(30), request_id="drop")
    for _ in range(5):
        engine.step()
    used_before = engine.block_manager.stats().used
    assert engine.abort("drop")
    assert engine.block_manager.stats().used < used_before
    assert not engine.abort("drop")  # already gone
    deltas = engine.step()
    dropped = [d for d in deltas if d.request_id == "drop"]
    assert dropped and dropped[-1].finish_reason == "abort" and dropped[-1].request_finished
    while engine.has_unfinished():
        deltas += engine.step()
    kept = [d for d in deltas if d.request_id == "keep"]
    assert kept[-1].finish_reason == "length" and kept[-1].num_output_tokens == 30
    assert engine.block_manager.stats().used == 0


def test_too_long_prompt_is_rejected_clearly_and_the_engine_keeps_serving(tiny: TinyModel) -> None:
    engine = tiny.engine(max_model_len=64)
    with pytest.raises(PromptTooLongError) as err:
        engine.add_request(list(range(100, 200)), greedy(4))
    assert err.value.num_tokens == 100 and err.value.limit == 63
    assert "100 tokens" in str(err.value)
    out = run_to_completion(engine, [list(range(100, 150))], greedy(40))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 64 - 50  # stopped at max_model_len


def test_prompt_larger_than_the_pool_is_rejected(tiny: TinyModel) -> None:
    engine = tiny.engine(num_kv_blocks=4)
    with pytest.raises(PromptTooLongError):
        engine.add_request(list(range(100, 180)), greedy(4))


def test_waiting_queue_limit_raises_overloaded(tiny: TinyModel) -> None:
    engine = tiny.engine(max_waiting=2)
    engine.add_request([5, 6, 7], greedy(2))
    engine.add_request([5, 6, 7], greedy(2))
    with pytest.raises(EngineOverloadedError):
        engine.add_request([5, 6, 7], greedy(2))


def test_seeded_sampling_is_reproducible_whatever_else_is_in_the_batch(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=9)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = run_to_completion(tiny.engine(), [prompt], params)[0].token_ids
    others = random_prompts(tiny.tokenizer, 5, seed=10)
    noisy = [SamplingParams(temperature=1.2, max_tokens=10, ignore_eos=True)] * 5
    mixed = run_to_completion(tiny.engine(), others + [prompt], noisy + [params], [0, 1, 2, 3, 4, 2])[-1]
    assert mixed.token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    assert run_to_completion(tiny.engine(), [prompt], other_seed)[0].token_ids != alone


def test_n_greater_than_one_forks_the_prompt_blocks(tiny: TinyModel) -> None:
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=11, min_len=40, max_len=40)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    request = engine.add_request(prompt, params)
    engine.step()  # prefill, first tokens, fork
    tables = [s.block_table for s in request.seqs]
    assert len(tables) == 3 and tables[0] == tables[1] == tables[2]
    assert engine.block_manager.stats().used == 3  # 40 tokens = 3 blocks, shared by all three
    while engine.has_unfinished():
        engine.step()
    out = engine.request_output(request)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 12 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_greedy_forks_with_copy_on_write_all_equal_the_single_greedy_output(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=12, min_len=37, max_len=37)[0]  # partial tail block
    single = run_to_completion(tiny.engine(), [prompt], greedy(15))[0].token_ids
    engine = tiny.engine()
    out = run_to_completion(engine, [prompt], greedy(15, n=3))[0]
    assert [c.token_ids for c in out.outputs] == [single] * 3


def test_beam_search_width_one_equals_greedy(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=13)[0]
    single = run_to_completion(tiny.engine(), [prompt], greedy(10))[0].token_ids
    beam = SamplingParams(use_beam_search=True, beam_width=1, max_tokens=10, ignore_eos=True, temperature=0)
    assert run_to_completion(tiny.engine(), [prompt], beam)[0].token_ids == single


def test_beam_search_returns_n_distinct_beams_best_first_and_frees_everything(tiny: TinyModel) -> None:
    engine = tiny.engine()
    prompt = random_prompts(tiny.tokenizer, 1, seed=14, min_len=20, max_len=20)[0]
    params = SamplingParams(
        use_beam_search=True, beam_width=4, n=3, max_tokens=8, ignore_eos=True, length_penalty=0.0
    )
    out = run_to_completion(engine, [prompt], params)[0]
    scores = [c.cumulative_logprob for c in out.outputs]
    assert len(out.outputs) == 3 and scores == sorted(scores, reverse=True)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in out.outputs)
    greedy_logprob = _sequence_logprob(
        tiny, prompt, run_to_completion(tiny.engine(), [prompt], greedy(8))[0].token_ids
    )
    assert scores[0] >= greedy_logprob - 1e-4
    assert engine.block_manager.stats().used == 0


def _sequence_logprob(tiny: TinyModel, prompt: list[int], output: list[int]) -> float:
    import torch

    with torch.no_grad():
        logits = tiny.hf(torch.tensor([prompt + output])).logits[0].float()
    logp = logits.log_softmax(-1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output))


def test_stop_strings_are_cut_from_the_text_and_held_back_while_streaming(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=15)[0]
    full = run_to_completion(tiny.engine(), [prompt], greedy(24))[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 5]
    assert len(stop.strip()) >= 3, full
    engine = tiny.engine()
    streamed: list[str] = []
    out = run_to_completion(
        engine, [prompt], greedy(24, stop=[stop]), on_step=lambda e, ds: streamed.extend(d.text for d in ds)
    )[0]
    expected = full[: full.index(stop)]
    assert out.text == expected and out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert "".join(streamed) == expected
    with_stop = run_to_completion(
        tiny.engine(), [prompt], greedy(24, stop=[stop], include_stop_str_in_output=True)
    )
    assert with_stop[0].text == expected + stop


def test_eos_stops_generation_unless_ignore_eos(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=16)[0]
    first = run_to_completion(tiny.engine(), [prompt], greedy(6))[0].token_ids
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[first[2]])
    out = run_to_completion(tiny.engine(), [prompt], params)[0]
    assert (
        out.token_ids == first[:3] and out.finish_reason == "stop" and out.outputs[0].stop_reason == first[2]
    )


def test_logprobs_are_returned_per_token(tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=17)[0]
    out = run_to_completion(tiny.engine(), [prompt], greedy(5, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert token in entry and len(entry) == 3  # greedy: the sampled token is the top one
        assert entry[token] == max(entry.values())
    assert out.cumulative_logprob == pytest.approx(
        sum(e[t] for t, e in zip(out.token_ids, out.logprobs, strict=True))
    )


def test_greedy_tokens_are_the_same_without_the_c_kernels(tiny, monkeypatch) -> None:
    """The C kernels (packed GEMM, layer ops, decode attention) and the PyTorch paths
    they replace decode the same tokens, and both match transformers."""
    from chatsite_kernels.cpu import build as cpu_build

    prompts = random_prompts(tiny.tokenizer, 6, seed=23)
    params = greedy(max_tokens=12)
    with_kernels = run_to_completion(tiny.engine(), prompts, params)
    monkeypatch.setenv("CHATSITE_CPU_KERNELS", "0")
    cpu_build.load_library.cache_clear()
    try:
        without = run_to_completion(tiny.engine(), prompts, params)
    finally:
        monkeypatch.delenv("CHATSITE_CPU_KERNELS")
        cpu_build.load_library.cache_clear()
    tokens = [o.outputs[0].token_ids for o in with_kernels]
    assert tokens == [o.outputs[0].token_ids for o in without]
    assert tokens[:2] == [tiny.hf_greedy(p, 12) for p in prompts[:2]]


def test_finished_requests_are_freed_by_reference_counting(tiny: TinyModel) -> None:
    """A request holds its sequences and a sequence its request only weakly, so nothing of
    a finished request waits for the garbage collector (see tests/api/test_reference_cycles.py)."""
    import gc

    from inference.engine.sequence import Request, Sequence

    prompts = random_prompts(tiny.tokenizer, 3, seed=3)
    params = [greedy(6), SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=1), greedy(6)]
    engine = tiny.engine()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        outs = run_to_completion(engine, prompts, params)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, Request | Sequence)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert [len(o.outputs) for o in outs] == [1, 2, 1]
    assert cyclic == []
