"""The KV slot figure of each step (taken once its tokens are cached, before finished
requests free their blocks) equals a count over every block in use: the slots each running
sequence's tail holds, a tail shared by forked sequences counted once."""

from __future__ import annotations

from typing import Any

import pytest

from inference.engine import llm_engine
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts


def slots_by_block(engine: LLMEngine) -> int:
    """Every block in use is full but the running sequences' tails, each at its fullest."""
    manager = engine.block_manager
    bs = manager.block_size
    tails: dict[int, int] = {}
    for request in engine.scheduler.running:
        for seq in request.seqs:
            if seq.block_table:
                fill = seq.num_computed_tokens - (len(seq.block_table) - 1) * bs
                tails[seq.block_table[-1]] = max(tails.get(seq.block_table[-1], 0), fill)
    used = manager.num_blocks - manager.num_free_blocks
    partial = [fill for fill in tails.values() if fill < bs]
    return (used - len(partial)) * bs + sum(partial)


def test_slots_used_match_a_count_over_blocks_with_forks_and_shared_prefixes(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tiny.engine(block_size=16)
    observed: list[tuple[int, int]] = []
    observe = llm_engine.observe_kv_usage

    def checked_observe(metrics: Any, scheduler: Any) -> None:
        observe(metrics, scheduler)
        observed.append((metrics.kv_slots_used, slots_by_block(engine)))

    monkeypatch.setattr(llm_engine, "observe_kv_usage", checked_observe)
    prompts = random_prompts(tiny.tokenizer, 4, seed=3, min_len=10, max_len=40)
    prompts.append(prompts[0] + [7] * 20)  # shares the first prompt's full blocks
    params = [
        greedy(40),
        SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=30, ignore_eos=True),
        greedy(25),
        SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=45, ignore_eos=True),
        greedy(35),
    ]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(prompt, p, f"r{i}")
    while engine.has_unfinished():
        engine.step()
    assert len(observed) > 20
    assert [ours for ours, _ in observed] == [counted for _, counted in observed]
