"""A prompt token id outside the model's vocabulary (ids stored under another model) is
refused at admission with ``InvalidPromptError``: it fails its own request, while the
requests in flight finish as if it had never come (in the step it would have crashed
them all)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from inference.config import EngineConfig
from inference.engine.async_engine import AsyncEngine
from inference.errors import InvalidPromptError
from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS, TinyModel, greedy, random_prompts


@pytest.fixture
def engine(tiny: TinyModel) -> Iterator[AsyncEngine]:
    config = EngineConfig(model=tiny.path, device="cpu", **TINY_ENGINE_DEFAULTS)
    eng = AsyncEngine(config, loaded=tiny.loaded)
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("bad", ["vocab_size", -1])
def test_an_id_outside_the_vocabulary_is_refused_at_admission_and_counted(tiny: TinyModel, bad) -> None:
    engine = tiny.engine()
    vocab = tiny.loaded[2].vocab_size
    bad_id = vocab if bad == "vocab_size" else bad
    with pytest.raises(InvalidPromptError) as info:
        engine.add_request([5, 6, bad_id, 7], greedy(4))
    assert (info.value.token_id, info.value.position, info.value.vocab_size) == (bad_id, 2, vocab)
    assert f"token id {bad_id} at position 2" in str(info.value)
    assert isinstance(info.value, ValueError)  # callers that map ValueError to "bad request" still do
    assert engine.stats().requests_by_outcome["rejected"] == 1 and not engine.has_unfinished()
    engine.add_request([5, 6, vocab - 1, 7], greedy(4))  # the last id of the vocabulary is fine


async def test_a_bad_id_fails_its_own_request_while_another_in_flight_completes(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=80, min_len=30, max_len=30)[0]
    offline = tiny.engine()
    request = offline.add_request(prompt, greedy(24))
    while offline.has_unfinished():
        offline.step()
    expected = offline.request_output(request).token_ids

    started = asyncio.Event()

    async def good() -> list[int]:
        tokens: list[int] = []
        async for delta in engine.stream(prompt, greedy(24), request_id="good"):
            tokens += delta.token_ids
            started.set()
        return tokens

    async def bad() -> None:
        await started.wait()  # the good request is mid-generation
        vocab = tiny.loaded[2].vocab_size
        async for _ in engine.stream(prompt[:10] + [vocab + 1000], greedy(4), request_id="bad"):
            pytest.fail("a refused request yields nothing")

    results = await asyncio.gather(good(), bad(), return_exceptions=True)
    assert isinstance(results[1], InvalidPromptError)
    assert results[0] == expected  # untouched, token for token
    stats = engine.stats()
    assert stats.requests_by_outcome["rejected"] == 1 and stats.requests_by_outcome["error"] == 0
