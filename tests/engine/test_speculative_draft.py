"""A draft model proposing for the target: greedy output identical to the engine without
speculation, with a draft that agrees with the target (the same weights: long accepted
runs) and with one that mostly does not (another random model: rejections, and the
draft's own KV cut back); the draft's pool is empty again at the end."""

from __future__ import annotations

import pytest

from inference.sampling.params import SamplingParams
from tests.engine.spec_fixtures import VOCAB, SmallModel, check_tables, run_all
from tests.engine.spec_fixtures import small as small  # noqa: F401  (fixture)
from tests.engine.test_speculative import prompts
from tests.support.fakes import make_tiny_model_dir

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("spec-draft") / "llama"
    return str(make_tiny_model_dir(path, arch="llama", seed=9, vocab_size=VOCAB, num_hidden_layers=1))


def run_pair(small: SmallModel, draft_path: str, params: SamplingParams) -> tuple[dict, dict, object]:
    ps = prompts(7, 5)
    arrivals = [0, 0, 2, 4, 9]
    plain = run_all(small.engine(max_num_batched_tokens=32), ps, params, arrivals)
    engine = small.engine(f"draft:{draft_path}", max_num_batched_tokens=32, speculative_max_batch=16)
    spec = run_all(engine, ps, params, arrivals, check=check_tables)
    proposer = engine.speculator.proposer
    proposer._sweep()  # the last finished sequences' shadows
    assert proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return plain, spec, engine


def test_a_draft_that_agrees_gives_long_accepted_runs_and_the_same_output(small: SmallModel) -> None:
    plain, spec, engine = run_pair(small, small.path, GREEDY)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    stats = engine.speculator.stats
    assert stats.accepted_tokens > 0.8 * stats.proposed_tokens > 0


def test_a_draft_that_disagrees_is_rejected_and_changes_nothing(small: SmallModel, other_draft: str) -> None:
    plain, spec, engine = run_pair(small, other_draft, GREEDY)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    stats = engine.speculator.stats
    assert stats.proposed_tokens > 0 and stats.accepted_tokens < 0.5 * stats.proposed_tokens


def test_seeded_sampling_with_a_draft_is_unchanged(small: SmallModel, other_draft: str) -> None:
    params = SamplingParams(temperature=0.8, top_k=10, seed=3, max_tokens=30, ignore_eos=True, logprobs=1)
    plain, spec, engine = run_pair(small, small.path, params)
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    assert engine.speculator.stats.accepted_tokens > 0


def test_a_draft_with_another_vocabulary_is_refused(small: SmallModel, tmp_path) -> None:
    path = make_tiny_model_dir(tmp_path / "wide", arch="llama", seed=1, vocab_size=VOCAB * 2)
    with pytest.raises(ValueError, match="vocabulary"):
        small.engine(f"draft:{path}")
