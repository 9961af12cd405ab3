"""The step time budget: prompt chunks sized from the measured prefill rate while
streams decode, and the same greedy tokens as full chunks."""

from __future__ import annotations

import pytest

from inference.engine.step_budget import MIN_CHUNK, StepBudget, count_tokens
from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _step(budget: StepBudget, clock: FakeClock, seconds: float, prefill: int, decode: int) -> None:
    budget.start()
    clock.now += seconds
    budget.observe(prefill, decode)


def test_no_limit_without_decoding_streams_or_budget() -> None:
    budget = StepBudget(0.15, 2048, clock=FakeClock())
    assert budget.prefill_limit(0) is None
    assert StepBudget(0.0, 2048).prefill_limit(8) is None


def test_first_chunk_before_any_measurement() -> None:
    budget = StepBudget(0.15, 2048, clock=FakeClock())
    assert budget.prefill_limit(3) == 256
    assert StepBudget(0.15, 100, clock=FakeClock()).prefill_limit(3) == 100


def test_chunk_follows_measured_rate() -> None:
    clock = FakeClock()
    budget = StepBudget(0.15, 2048, clock=clock)
    _step(budget, clock, 0.05, prefill=0, decode=8)  # decode-only step: 50 ms
    assert budget.decode_step_s == pytest.approx(0.05)
    _step(budget, clock, 0.05 + 0.001 * 500, prefill=500, decode=8)  # 1 ms per prompt token
    assert budget.prefill_s_per_token == pytest.approx(0.001)
    assert budget.prefill_tokens_per_s == pytest.approx(1000)
    # (150 ms - 50 ms decode) / 1 ms per token
    assert budget.prefill_limit(8) == 100
    # A faster machine: 0.1 ms per token gives 1,000 tokens, capped by the step's token budget.
    fast = StepBudget(0.15, 512, clock=clock)
    _step(fast, clock, 0.05, prefill=1000, decode=0)
    assert fast.prefill_limit(1) == 512


def test_ewma_moves_toward_new_rate_and_floor_holds() -> None:
    clock = FakeClock()
    budget = StepBudget(0.15, 2048, clock=clock)
    _step(budget, clock, 0.1, prefill=100, decode=0)  # 1 ms/token
    _step(budget, clock, 0.2, prefill=50, decode=0)  # 4 ms/token: slower now
    assert 0.001 < budget.prefill_s_per_token < 0.004
    # A machine so slow that no prompt token fits the budget still gets the floor.
    _step(budget, clock, 10.0, prefill=32, decode=0)
    assert budget.prefill_limit(4) == MIN_CHUNK


def test_decodes_that_fill_the_budget_leave_prompts_a_share_of_their_time() -> None:
    """16 streams over long histories on a busy machine: the decodes alone take 300 ms of
    a 150 ms budget. Prompts still get half the decodes' time (150 tokens at 1 ms each),
    not the 32-token floor that would make a 1,000-token turn wait some 30 steps."""
    clock = FakeClock()
    budget = StepBudget(0.15, 2048, clock=clock)
    _step(budget, clock, 0.3, prefill=0, decode=16)
    _step(budget, clock, 0.3 + 0.001 * 100, prefill=100, decode=16)
    assert budget.prefill_limit(16) == 150
    budget.prefill_share = 0.0  # no share: the floor alone
    assert budget.prefill_limit(16) == MIN_CHUNK
    # Below the budget the share changes nothing: (150 - 50) ms / 1 ms = 100 > 0.5 × 50 ms.
    _step(budget, clock, 0.05, prefill=0, decode=16)
    budget.decode_step_s = 0.05
    budget.prefill_share = 0.5
    assert budget.prefill_limit(16) == 100


def test_observe_without_start_is_ignored() -> None:
    budget = StepBudget(0.15, 2048, clock=FakeClock())
    budget.observe(100, 0)
    assert budget.prefill_s_per_token is None


def test_count_tokens() -> None:
    assert count_tokens([1, 1, 40, 1, 7]) == (47, 3)


def test_scheduler_caps_prompt_chunks_while_streams_decode(tiny) -> None:
    """With streams decoding, a long prompt is fed in chunks the budget allows; the
    decodes are never cut."""
    engine = tiny.engine(max_num_batched_tokens=512, step_budget_ms=150.0)
    budget = engine.scheduler.step_budget
    assert budget is not None
    budget.first_chunk = 48
    for i, prompt in enumerate(random_prompts(tiny.tokenizer, 3, seed=1, max_len=20)):
        engine.add_request(prompt, greedy(40), request_id=f"s{i}")
    for _ in range(3):
        engine.step()
    budget.prefill_s_per_token, budget.decode_step_s = 0.0015, 0.09  # measured: (150 - 90) / 1.5 = 40
    budget.observe = lambda *a: None  # keep the rate fixed for the assertion
    engine.add_request(random_prompts(tiny.tokenizer, 1, seed=2, min_len=300, max_len=300)[0], greedy(4))
    batch = engine.scheduler.schedule()
    prefill, decode = count_tokens(batch.num_new_tokens)
    assert decode == 3
    assert prefill == 40


def test_greedy_tokens_unchanged_by_the_budget(tiny) -> None:
    prompts = random_prompts(tiny.tokenizer, 4, seed=3, max_len=30) + random_prompts(
        tiny.tokenizer, 2, seed=4, min_len=200, max_len=260
    )
    arrivals = [0, 0, 0, 0, 3, 5]
    full = run_to_completion(tiny.engine(step_budget_ms=0.0), prompts, greedy(12), arrivals)
    # A budget below any decode step of the tiny model: prompts go in minimum chunks.
    small = tiny.engine(step_budget_ms=0.001)
    small.scheduler.step_budget.prefill_share = 0.0  # no share of the decode time: the floor alone
    steps: list[tuple[int, int]] = []
    schedule = small.scheduler.schedule

    def recording_schedule():  # type: ignore[no-untyped-def]
        batch = schedule()
        steps.append(count_tokens(batch.num_new_tokens))
        return batch

    small.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    budgeted = run_to_completion(small, prompts, greedy(12), arrivals)
    assert [o.outputs[0].token_ids for o in budgeted] == [o.outputs[0].token_ids for o in full]
    mixed = [prefill for prefill, decode in steps[2:] if decode and prefill]
    assert mixed and max(mixed) <= MIN_CHUNK  # the long prompts were cut to the floor


def test_steps_of_decodes_skip_counting_the_decoding_streams(tiny) -> None:
    """The allowance's count of decoding requests (a pass over every running one) is made
    only in steps that plan a prompt chunk, where it caps the chunk as before; decodes,
    those that take a new block included, never need it."""
    engine = tiny.engine(max_num_batched_tokens=512, step_budget_ms=150.0)
    scheduler = engine.scheduler
    counted: list[int] = []
    count = scheduler._prefill_limit

    def counting() -> int | None:
        counted.append(len(scheduler.running))
        return count()

    scheduler._prefill_limit = counting  # type: ignore[method-assign]
    for i, prompt in enumerate(random_prompts(tiny.tokenizer, 3, seed=1, max_len=20)):
        engine.add_request(prompt, greedy(80), request_id=f"s{i}")
    engine.step()  # the prompts: counted
    assert counted
    counted.clear()
    for _ in range(2 * engine.block_manager.block_size):  # each stream crosses a block or two
        engine.step()
    assert counted == []
    engine.add_request(random_prompts(tiny.tokenizer, 1, seed=2, min_len=300, max_len=300)[0], greedy(4))
    engine.step()
    assert counted == [3]  # a new prompt: counted before it is admitted
