"""Sampling with speculation keeps the target's distribution: a chi-square test of the
second and third generated tokens (the second always comes from a verify row, the third
from one when the proposal was accepted, else from an ordinary step) against their exact
marginals, computed from the model by enumerating the 64-token vocabulary."""

from __future__ import annotations

from collections import Counter

import torch

from inference.engine.sequence import Sequence
from inference.sampling.params import SamplingParams
from tests.engine.spec_fixtures import VOCAB, SmallModel, run_all
from tests.engine.spec_fixtures import small as small  # noqa: F401  (fixture)

PROMPT = [5, 17, 33, 8, 41, 17, 33]
TEMPERATURE = 0.9
SAMPLES = 3000


class GreedyDraft:
    """Proposes the target's own most likely next tokens (computed with the HF model in one
    batch), so proposals are accepted often but not always."""

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf

    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        # One batch per length: a step can hold a sequence whose cached prompt left only
        # its last token to run (a decode-shaped row, one token shorter than the others).
        by_length: dict[int, list[int]] = {}
        for i, seq in enumerate(seqs):
            by_length.setdefault(seq.num_tokens, []).append(i)
        first = [0] * len(seqs)
        for rows in by_length.values():
            with torch.no_grad():
                logits = self.hf(torch.tensor([seqs[i].token_ids for i in rows])).logits[:, -1]
            for i, token in zip(rows, logits.argmax(-1).tolist(), strict=True):
                first[i] = token
        return [[t][:limit] for t, limit in zip(first, limits, strict=True)]

    def verified(self, seq: Sequence, draft: list[int], accepted: int) -> None:
        pass


def next_probs(hf: torch.nn.Module, contexts: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (hf(contexts).logits[:, -1].double() / TEMPERATURE).softmax(-1)


def exact_marginals(hf: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t2) and P(t3) for the prompt, summing over every t1 (and t2)."""
    prompt = torch.tensor(PROMPT)
    p1 = next_probs(hf, prompt[None])[0]  # [V]
    ctx2 = torch.cat([prompt.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], 1)
    p2 = next_probs(hf, ctx2)  # [t1, t2]
    ctx3 = torch.cat([ctx2.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(VOCAB)[:, None]], 1)
    p3 = next_probs(hf, ctx3).view(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
    joint12 = p1[:, None] * p2
    return joint12.sum(0), (joint12[:, :, None] * p3).sum((0, 1))


def chi_square_p(counts: Counter, probs: torch.Tensor, n: int) -> float:
    """Pearson's test; cells expected below 5 are pooled into one."""
    expected = probs * n
    observed = torch.tensor([counts.get(t, 0) for t in range(len(probs))], dtype=torch.float64)
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def test_speculative_sampling_keeps_the_target_distribution(small: SmallModel) -> None:
    torch.manual_seed(0)
    want2, want3 = exact_marginals(small.hf)
    engine = small.engine(
        "ngram",
        max_num_seqs=128,
        max_num_batched_tokens=1024,
        num_kv_blocks=512,
        speculative_max_batch=128,
        max_waiting=SAMPLES,
    )
    engine.speculator.proposer = GreedyDraft(small.hf)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=3, ignore_eos=True)
    outs = run_all(engine, [PROMPT] * SAMPLES, params)
    seconds = Counter(o.token_ids[1] for o in outs.values())
    thirds = Counter(o.token_ids[2] for o in outs.values())
    stats = engine.speculator.stats
    # The third token came through an accepted proposal often, and through a rejection often.
    assert 0.2 * SAMPLES < stats.accepted_tokens < 0.9 * SAMPLES
    assert chi_square_p(seconds, want2, SAMPLES) > 1e-3
    assert chi_square_p(thirds, want3, SAMPLES) > 1e-3
    # The test has power: the draft's own (point-mass) choice is far from the target's.
    always_draft = Counter({t: SAMPLES * float(want2.max()) for t in [int(want2.argmax())]})
    assert chi_square_p(always_draft, want2, SAMPLES) < 1e-6
