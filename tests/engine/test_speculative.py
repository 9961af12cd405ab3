"""Speculative decoding: greedy output identical to the engine without it (n-gram and
known-answer proposals, accepted and rejected, beside prefill chunks), seeded sampling
unchanged, penalties, stop rules, logprobs and max_tokens intact, KV slots of rejected
tokens released, and the settings."""

from __future__ import annotations

import random

import pytest

from chatsite.speculative_setting import parse_speculative
from inference.config import EngineConfig
from inference.sampling.params import SamplingParams
from inference.spec.ngram import NgramProposer
from tests.engine.spec_fixtures import VOCAB, OracleProposer, SmallModel, check_tables, run_all
from tests.engine.spec_fixtures import small as small  # noqa: F401  (fixture)

GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def prompts(seed: int, count: int = 5) -> list[list[int]]:
    """Random prompts, some of them a phrase repeated (prompt lookup finds those)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        phrase = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 9))]
        out.append(phrase * rng.randint(2, 6) if i % 2 == 0 else phrase * 3 + phrase[:2])
    return out


def with_oracle(small: SmallModel, reference: dict, **kw) -> object:
    engine = small.engine("ngram", **kw)
    engine.speculator.proposer = OracleProposer({r: o.token_ids for r, o in reference.items()})
    return engine


# ---- settings ----------------------------------------------------------------------------
@pytest.mark.smoke
def test_engine_speculative_strings_parse_to_config_fields() -> None:
    assert parse_speculative("") == {"speculative": None}
    assert parse_speculative("off") == {"speculative": None}
    assert parse_speculative("ngram") == {"speculative": "ngram"}
    assert parse_speculative("ngram:k=5") == {"speculative": "ngram", "num_speculative_tokens": 5}
    assert parse_speculative("ngram:k=3,min=1,max=5,max_batch=8") == {
        "speculative": "ngram",
        "num_speculative_tokens": 3,
        "ngram_min": 1,
        "ngram_max": 5,
        "speculative_max_batch": 8,
    }
    assert parse_speculative("draft:/m/small") == {"speculative": "draft:/m/small"}
    assert parse_speculative("draft:/m/small,k=4") == {
        "speculative": "draft:/m/small",
        "num_speculative_tokens": 4,
    }
    for bad in ("eagle", "ngram:k", "ngram:q=3", "draft:", "ngram:k=x"):
        with pytest.raises(ValueError):
            parse_speculative(bad)
    EngineConfig(**parse_speculative("ngram:k=5"))
    for bad_config in (
        {"speculative": "medusa"},
        {"speculative": "draft:"},
        {"num_speculative_tokens": 0},
        {"ngram_min": 5, "ngram_max": 2},
    ):
        with pytest.raises(ValueError):
            EngineConfig(**bad_config)
    assert EngineConfig().speculative is None  # off by default


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    proposer = NgramProposer(k=3, n_min=1, n_max=3)
    from inference.engine.sequence import Sequence

    seq = Sequence([5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7], num_prompt_tokens=12)
    # "6 7" occurs twice before the end; the later one was followed by 2 3.
    assert proposer.propose(seq, limit=10) == [2, 3, 6]
    assert proposer.propose(seq, limit=1) == [2]
    seq.token_ids += [2, 3, 9]  # "3 9" never occurred, "9" did: followed by 1 6 7
    assert proposer.propose(seq, limit=10) == [1, 6, 7]
    seq.token_ids.append(42)  # a token never seen: nothing to propose
    assert proposer.propose(seq, limit=10) == []


# ---- greedy: identical ---------------------------------------------------------------------
def test_greedy_ngram_output_is_identical_beside_prefill_chunks(small: SmallModel) -> None:
    ps = prompts(1, 6)
    arrivals = [0, 0, 3, 5, 9, 14]
    # A small token budget chunks the later prompts' prefill while the first ones verify.
    plain = run_all(small.engine(max_num_batched_tokens=24), ps, GREEDY, arrivals)
    engine = small.engine("ngram", max_num_batched_tokens=24, speculative_max_batch=16, ngram_min=1)
    mixed = []  # steps that verified proposals beside a prefill chunk
    propose = engine.speculator.propose

    def spy(batch):
        run = propose(batch)
        mixed.append(run is not batch and any(n > 1 for n in batch.num_new_tokens))
        return run

    engine.speculator.propose = spy
    spec = run_all(engine, ps, GREEDY, arrivals, check=check_tables)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    stats = engine.speculator.stats
    assert stats.verifications > 0 and stats.accepted_tokens > 0
    assert any(mixed)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_greedy_known_answer_proposals_accept_runs_and_reject_the_wrong_token(small: SmallModel) -> None:
    ps = prompts(2, 4)
    plain = run_all(small.engine(), ps, GREEDY)
    engine = with_oracle(small, plain, speculative_max_batch=16)
    spec = run_all(engine, ps, GREEDY, check=check_tables)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    stats = engine.speculator.stats
    # Every seventh proposed token is wrong: most are accepted, and some are rejected.
    assert 0.5 * stats.proposed_tokens < stats.accepted_tokens < stats.proposed_tokens
    assert engine.metrics.num_steps < 0.6 * 48  # several tokens per step
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_rejected_proposals_everywhere_still_give_the_same_output(small: SmallModel) -> None:
    ps = prompts(3, 3)
    plain = run_all(small.engine(), ps, GREEDY)
    engine = small.engine("ngram", speculative_max_batch=16, speculative_min_acceptance=0.0)
    proposer = OracleProposer({r: o.token_ids for r, o in plain.items()}, wrong_every=1)
    engine.speculator.proposer = proposer
    spec = run_all(engine, ps, GREEDY, check=check_tables)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    assert engine.speculator.stats.accepted_tokens == 0 < engine.speculator.stats.proposed_tokens


# ---- everything else holds -------------------------------------------------------------------
def test_seeded_sampling_with_penalties_is_unchanged_by_speculation(small: SmallModel) -> None:
    """Each emitted token draws one noise vector from its sequence's generator, with or
    without speculation, so a seeded request gives the very same tokens."""
    ps = prompts(4, 4)
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=8, seed=12, max_tokens=40, repetition_penalty=1.3),
        SamplingParams(temperature=0.7, min_p=0.05, seed=13, max_tokens=40, presence_penalty=0.5),
        SamplingParams(temperature=0.9, seed=14, max_tokens=40, frequency_penalty=0.8, logprobs=2),
    ]
    plain = run_all(small.engine(), ps, params)
    engine = with_oracle(small, plain, speculative_max_batch=16)
    spec = run_all(engine, ps, params, check=check_tables)
    for rid, out in plain.items():
        assert spec[rid].token_ids == out.token_ids
        assert spec[rid].finish_reason == out.finish_reason
    assert engine.speculator.stats.accepted_tokens > 0


def test_penalties_stop_rules_logprobs_and_max_tokens_hold(small: SmallModel) -> None:
    ps = prompts(5, 5)
    base = run_all(small.engine(), ps[:1], GREEDY)["r0"]
    stop_token = base.token_ids[20]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, presence_penalty=1.0, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_token], ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=13, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
    ]
    plain = run_all(small.engine(), ps, params)
    # A stop string taken from the middle of one output's text.
    text = plain["r4"].text
    params[4] = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[text[12:15]])
    plain = run_all(small.engine(), ps, params)
    engine = with_oracle(small, plain, speculative_max_batch=16)
    spec = run_all(engine, ps, params, check=check_tables)
    for rid, out in plain.items():
        got = spec[rid]
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            out.token_ids,
            out.text,
            out.finish_reason,
            out.stop_reason,
        ), rid
    assert spec["r4"].finish_reason == "stop" and spec["r4"].stop_reason == text[12:15]
    assert len(spec["r3"].token_ids) == 13
    assert [sorted(d) for d in spec["r3"].logprobs] == [sorted(d) for d in plain["r3"].logprobs]
    for got, want in zip(spec["r3"].logprobs, plain["r3"].logprobs, strict=True):
        for token, value in want.items():
            assert got[token] == pytest.approx(value, abs=1e-4)
    assert engine.speculator.stats.accepted_tokens > 0


# ---- adaptive ------------------------------------------------------------------------------
def test_the_policy_pauses_a_rejected_sequence_and_sizes_proposals_by_acceptance() -> None:
    from inference.engine.sequence import Sequence
    from inference.spec.adaptive import FIRST_PAUSE, MIN_VERIFICATIONS, AdaptivePolicy

    policy = AdaptivePolicy(min_acceptance=0.3, max_batch=4, k=8)
    copying, chatting = Sequence([1], 1), Sequence([1], 1)
    assert policy.batch_allows(4) and not policy.batch_allows(5)
    assert policy.draft_length(copying) == 2
    for _ in range(3):
        policy.observe(copying, policy.draft_length(copying), policy.draft_length(copying))
    assert policy.draft_length(copying) == 8  # all accepted: 2 -> 4 -> 8 (k)
    policy.observe(copying, 8, 3)
    assert policy.draft_length(copying) == 4  # cut to one more than accepted
    for _ in range(MIN_VERIFICATIONS + 2):
        policy.observe(chatting, 2, 0)
    assert not policy.allows(chatting) and policy.allows(copying)
    policy.step += FIRST_PAUSE
    assert policy.allows(chatting)  # tried again after the pause


def test_speculation_is_off_above_the_batch_limit(small: SmallModel) -> None:
    ps = prompts(6, 6)
    engine = small.engine("ngram", speculative_max_batch=2, ngram_min=1)
    run_all(engine, ps, GREEDY)
    assert engine.speculator.stats.verifications == 0
    engine = small.engine("ngram", speculative_max_batch=6, ngram_min=1)
    run_all(engine, ps, GREEDY)
    assert engine.speculator.stats.verifications > 0


def test_parallel_samples_and_beams_run_beside_speculating_requests(small: SmallModel) -> None:
    ps = prompts(8, 3)
    params = [
        GREEDY,
        SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=24, ignore_eos=True),
        SamplingParams(n=2, use_beam_search=True, temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    plain = run_all(small.engine(), ps, params)
    engine = with_oracle(small, {"r0": plain["r0"]}, speculative_max_batch=16)
    spec = run_all(engine, ps, params, check=check_tables)
    for rid, out in plain.items():
        assert spec[rid].token_ids == out.token_ids, rid
    assert engine.speculator.stats.accepted_tokens > 0  # only r0 speculated (the oracle knows only it)
