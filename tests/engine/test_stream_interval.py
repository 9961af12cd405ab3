"""AsyncEngine's stream interval: a running request's tokens reach its stream folded, at
most once per interval, while its first and last deltas come at once; the tokens, text and
counts are those of a stream that gets a delta after every step."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from inference.config import EngineConfig
from inference.engine.async_engine import AsyncEngine
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS, TinyModel, greedy, random_prompts


def make(tiny: TinyModel, interval: float) -> AsyncEngine:
    config = EngineConfig(model=tiny.path, device="cpu", **TINY_ENGINE_DEFAULTS)
    return AsyncEngine(config, loaded=tiny.loaded, stream_interval=interval)


@pytest.fixture
def engines(tiny: TinyModel) -> Iterator[tuple[AsyncEngine, AsyncEngine]]:
    every_step, folded = make(tiny, 0.0), make(tiny, 3600.0)
    yield every_step, folded
    every_step.shutdown()
    folded.shutdown()


async def collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> list:
    return [d async for d in engine.stream(prompt, params)]


def summary(deltas: list) -> dict[int, tuple[list[int], str, int, str | None]]:
    """Per completion: its token ids, text, final count and finish reason."""
    out: dict[int, tuple[list[int], str, int, str | None]] = {}
    for d in deltas:
        ids, text, _, _ = out.get(d.index, ([], "", 0, None))
        out[d.index] = (ids + d.token_ids, text + d.text, d.num_output_tokens, d.finish_reason)
    return out


async def test_a_long_interval_folds_the_middle_into_the_last_delta(engines, tiny: TinyModel) -> None:
    every_step, folded = engines
    prompt = random_prompts(tiny.tokenizer, 1, seed=40)[0]
    reference = await collect(every_step, prompt, greedy(12))
    assert len(reference) == 12
    deltas = await collect(folded, prompt, greedy(12))
    # The first token at once (time to first token), the other eleven with the finish.
    assert [len(d.token_ids) for d in deltas] == [1, 11]
    assert deltas[-1].finished and deltas[-1].request_finished and deltas[-1].num_output_tokens == 12
    assert summary(deltas) == summary(reference)


async def test_stop_strings_and_parallel_samples_match_per_step_streams(engines, tiny: TinyModel) -> None:
    every_step, folded = engines
    prompt = random_prompts(tiny.tokenizer, 1, seed=41)[0]
    text = "".join(d.text for d in await collect(every_step, prompt, greedy(20)))
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    for params in (greedy(20, stop=[stop]), SamplingParams(n=3, max_tokens=9, seed=3, ignore_eos=True)):
        reference, deltas = await asyncio.gather(
            collect(every_step, prompt, params), collect(folded, prompt, params)
        )
        assert summary(deltas) == summary(reference)
        assert len(deltas) < len(reference)
        assert deltas[-1].request_finished and sum(d.request_finished for d in deltas) == 1


async def test_an_abort_hands_over_every_token_generated(engines, tiny: TinyModel) -> None:
    _, folded = engines
    prompt = random_prompts(tiny.tokenizer, 1, seed=42)[0]
    deltas = []
    async for delta in folded.stream(prompt, greedy(2000), request_id="folded-abort"):
        deltas.append(delta)
        if len(deltas) == 1:
            await asyncio.sleep(0.3)  # steps run, their tokens held back
            folded.abort("folded-abort")
    last = deltas[-1]
    assert last.finish_reason == "abort" and last.request_finished
    assert len(deltas) == 2 and last.num_output_tokens > 1
    assert sum(len(d.token_ids) for d in deltas) == last.num_output_tokens
