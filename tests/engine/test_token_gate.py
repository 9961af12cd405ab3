"""Token budgets enforced by the engine (``inference.engine.token_gate``) and fair-share
weights: requests sharing a budget stop in the step that spends it, with
``finish_reason="length"``; owners of weights 1 and 3 hold seats one to three."""

from __future__ import annotations

import threading

from inference.engine.token_gate import QUOTA_STOP
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts


class CountingGate:
    """A budget of ``limit`` output tokens shared by every request holding this gate."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.lock = limit, 0, threading.Lock()

    def charge(self, tokens: int) -> bool:
        with self.lock:
            self.used += tokens
            return self.used < self.limit


def test_requests_sharing_a_budget_stop_within_one_step_of_it(tiny: TinyModel) -> None:
    engine = tiny.engine(max_num_seqs=8)
    gate = CountingGate(limit=50)
    prompts = random_prompts(tiny.tokenizer, 8, seed=21, min_len=4, max_len=10)
    requests = [engine.add_request(p, greedy(40), owner="u", token_gate=gate) for p in prompts]
    unbudgeted = engine.add_request(prompts[0], greedy(12), owner="v")
    while engine.has_unfinished():
        engine.step()
    served = sum(len(r.outputs_in_order()[0].output_token_ids) for r in requests)
    assert 50 <= served < 50 + len(requests)  # at most one step's tokens (one per request) past it
    assert served == gate.used
    stopped = [r.outputs_in_order()[0] for r in requests]
    assert all(s.finish_reason == "length" for s in stopped)
    assert {s.stop_reason for s in stopped} == {QUOTA_STOP}
    assert len(unbudgeted.outputs_in_order()[0].output_token_ids) == 12  # others run on


def test_a_budget_crossed_mid_answer_keeps_the_tokens_served(tiny: TinyModel) -> None:
    engine = tiny.engine()
    [prompt] = random_prompts(tiny.tokenizer, 1, seed=4)
    free = engine.add_request(prompt, greedy(20))
    limited = engine.add_request(prompt, greedy(20), token_gate=CountingGate(limit=7))
    while engine.has_unfinished():
        engine.step()
    out = limited.outputs_in_order()[0].output_token_ids
    assert len(out) == 7 and out == free.outputs_in_order()[0].output_token_ids[:7]


def test_weighted_owners_hold_seats_in_the_ratio_of_their_weights(tiny: TinyModel) -> None:
    engine = tiny.engine(max_num_seqs=8)
    prompts = random_prompts(tiny.tokenizer, 60, seed=8, min_len=4, max_len=8)
    for i, p in enumerate(prompts):
        owner, weight = ("light", 1.0) if i % 2 else ("heavy", 3.0)
        engine.add_request(p, greedy(6), owner=owner, weight=weight)
    engine.step()
    seats = {"light": 0, "heavy": 0}
    for r in engine.scheduler.running:
        seats[r.owner] += 1
    assert seats == {"light": 2, "heavy": 6}
    while engine.has_unfinished():
        engine.step()
