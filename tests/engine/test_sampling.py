"""SamplingParams validation and the sampler's rules on hand-made logits (no model)."""

from __future__ import annotations

import pytest
import torch

from inference.engine.sequence import Sequence
from inference.sampling.params import SamplingParams
from inference.sampling.sampler import Sampler, apply_penalties


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
        ("max_tokens", -1),
        ("top_k", -3),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("logprobs", 100),
        ("best_of", 0),
        ("seed", "x"),
        ("stop", [""]),
        ("temperature", float("nan")),
    ],
)
def test_invalid_sampling_values_raise_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_defaults_and_normalisation() -> None:
    p = SamplingParams(stop="###", top_k=-1)
    assert p.stop == ["###"] and p.top_k == 0 and p.n == 1 and not p.greedy
    assert SamplingParams(temperature=0).greedy
    beam = SamplingParams(use_beam_search=True, n=2)
    assert beam.beam_width == 2 and beam.width == 2
    assert SamplingParams(n=3).width == 3


def seq(tokens: list[int], prompt_len: int = 1, generator: torch.Generator | None = None) -> Sequence:
    return Sequence(list(tokens), prompt_len, generator=generator)


def draw(logits: torch.Tensor, params: SamplingParams, times: int = 400, seed: int = 0) -> set[int]:
    sampler = Sampler(torch.device("cpu"), seed=seed)
    batch = logits.repeat(times, 1)
    return set(sampler(batch, [seq([0])] * times, [params] * times).token_ids)


LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))


def test_greedy_takes_the_argmax() -> None:
    assert draw(LOGITS, SamplingParams(temperature=0), times=3) == {0}


def test_top_k_top_p_and_min_p_restrict_the_candidates() -> None:
    assert draw(LOGITS, SamplingParams(temperature=1.0)) == {0, 1, 2, 3, 4}
    assert draw(LOGITS, SamplingParams(top_k=2)) == {0, 1}
    assert draw(LOGITS, SamplingParams(top_p=0.7)) == {0, 1}  # 0.5 + 0.25 reaches 0.7
    assert draw(LOGITS, SamplingParams(top_p=0.8)) == {0, 1, 2}
    assert draw(LOGITS, SamplingParams(min_p=0.2)) == {0, 1, 2}  # >= 0.2 * 0.5
    assert draw(LOGITS, SamplingParams(top_k=3, top_p=0.6)) == {0, 1}


def test_rows_with_different_params_in_one_batch_each_follow_their_own() -> None:
    sampler = Sampler(torch.device("cpu"))
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(top_k=2)] * 50
    out = sampler(LOGITS.repeat(150, 1), [seq([0])] * 150, params).token_ids
    assert set(out[0::3]) == {0} and set(out[1::3]) == {0} and set(out[2::3]) == {0, 1}


def test_penalties_follow_vllm_semantics() -> None:
    row = torch.tensor([2.0, -2.0, 1.0, 1.0])
    s = seq([0, 1, 2, 2], prompt_len=2)  # prompt [0, 1], output [2, 2]
    apply_penalties(row, s, SamplingParams(repetition_penalty=2.0))
    assert row.tolist() == [1.0, -4.0, 0.5, 1.0]
    row = torch.tensor([2.0, -2.0, 1.0, 1.0])
    apply_penalties(row, s, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    assert row.tolist() == [2.0, -2.0, 0.0, 1.0]  # only output tokens: 1 - 0.5 - 2 * 0.25


def test_a_seeded_row_draws_the_same_whatever_its_neighbours() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=7)

    def run(batch_size: int, position: int) -> list[int]:
        sampler = Sampler(torch.device("cpu"), seed=batch_size)
        g = sampler.make_generator(7)
        tokens = []
        for _ in range(5):
            rows = (
                logits.repeat(batch_size, 1)
                + torch.randn(batch_size, 1000) * (torch.arange(batch_size) != position)[:, None]
            )
            seqs = [seq([0], generator=g if i == position else None) for i in range(batch_size)]
            tokens.append(sampler(rows, seqs, [params] * batch_size).token_ids[position])
        return tokens

    assert run(1, 0) == run(6, 3) == run(3, 2)


def test_logprobs_are_the_models_log_softmax() -> None:
    sampler = Sampler(torch.device("cpu"))
    result = sampler(LOGITS[None], [seq([0])], [SamplingParams(temperature=0, logprobs=2)])
    assert result.token_ids == [0]
    top = result.top_logprobs[0]
    assert set(top) == {0, 1} and top[0] == pytest.approx(float(LOGITS.log_softmax(-1)[0]))
