"""Prompt chunks under the step time budget, fewest uncached tokens first: a new turn after
a cached history runs before long first prompts finish, with the same greedy tokens."""

from __future__ import annotations

from typing import Any

from inference.engine.llm_engine import LLMEngine
from inference.engine.prompt_order import fewest_uncached_first, uncached_tokens, wants_prompt_chunk
from inference.engine.sequence import Request
from tests.engine.engine_fixtures import greedy, random_prompts


def _fixed_allowance(engine: LLMEngine) -> None:
    """Measured rates that give prompt chunks 40 tokens a step: (150 - 90) ms / 1.5 ms."""
    budget = engine.scheduler.step_budget
    assert budget is not None
    budget.prefill_s_per_token, budget.decode_step_s = 0.0015, 0.09
    budget.observe = lambda *a: None  # type: ignore[method-assign]


def _steps_to_first_token(engine: LLMEngine, request: Request, limit: int = 200) -> int:
    for step in range(1, limit + 1):
        engine.step()
        if engine.request_output(request).token_ids:
            return step
    raise AssertionError("no first token")


def _turn_behind_first_prompts(tiny: Any, step_budget_ms: float) -> tuple[int, list[int], list[bool]]:
    """A stream decodes, three 300-token first prompts arrive, then a turn whose 200-token
    history is cached: steps to the turn's first token, its tokens, and whether each
    first prompt was still prefilling when that token came."""
    engine = tiny.engine(max_num_batched_tokens=512, step_budget_ms=step_budget_ms)
    history = random_prompts(tiny.tokenizer, 1, seed=7, min_len=200, max_len=200)[0]
    engine.add_request(history, greedy(1))
    while engine.has_unfinished():
        engine.step()  # the history is now in the prefix cache
    engine.add_request(random_prompts(tiny.tokenizer, 1, seed=8, max_len=20)[0], greedy(400))
    engine.step()
    if step_budget_ms:
        _fixed_allowance(engine)
    firsts = [engine.add_request(p, greedy(4)) for p in random_prompts(tiny.tokenizer, 3, 9, 300, 300)]
    engine.step()
    turn = engine.add_request(
        history + random_prompts(tiny.tokenizer, 1, seed=10, min_len=24, max_len=24)[0], greedy(8)
    )
    steps = _steps_to_first_token(engine, turn)
    prefilling = [not engine.request_output(r).token_ids for r in firsts]
    while not engine.request_output(turn).finished:
        engine.step()
    return steps, engine.request_output(turn).token_ids, prefilling


def test_a_cached_turn_goes_before_long_first_prompts(tiny) -> None:
    steps, tokens, prefilling = _turn_behind_first_prompts(tiny, 150.0)
    # 32 uncached tokens fit one step's 40: admitted in the step the allowance ran out,
    # its chunk in the next, while the 900 first-prompt tokens need some 22 steps.
    assert steps <= 2
    assert all(prefilling)
    _, unbudgeted, _ = _turn_behind_first_prompts(tiny, 0.0)
    assert tokens == unbudgeted


def test_order_counts_uncached_tokens(tiny) -> None:
    engine = tiny.engine()
    long, short = (engine.add_request(p, greedy(4)) for p in ([5] * 90, [6] * 30))
    assert [uncached_tokens(r) for r in (long, short)] == [90, 30]
    assert fewest_uncached_first([long, short]) == [short, long]
    assert wants_prompt_chunk(long)
    long.seqs[0].num_computed_tokens = 89
    assert not wants_prompt_chunk(long) and uncached_tokens(long) == 1
