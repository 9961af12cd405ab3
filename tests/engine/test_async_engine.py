"""AsyncEngine: streaming from the engine thread, abort (explicit, on break, on
cancellation), errors before the first delta, and live stats."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from inference.config import EngineConfig
from inference.engine.async_engine import AsyncEngine
from inference.errors import EngineOverloadedError, PromptTooLongError
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS, TinyModel, greedy, random_prompts


@pytest.fixture
def engine(tiny: TinyModel) -> Iterator[AsyncEngine]:
    config = EngineConfig(model=tiny.path, device="cpu", **TINY_ENGINE_DEFAULTS)
    eng = AsyncEngine(config, loaded=tiny.loaded)
    yield eng
    eng.shutdown()


async def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_stream_yields_deltas_that_add_up_to_the_offline_output(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=20)[0]
    offline = tiny.engine()
    request = offline.add_request(prompt, greedy(12))
    while offline.has_unfinished():
        offline.step()
    expected = offline.request_output(request)
    deltas = [d async for d in engine.stream(prompt, greedy(12), request_id="a")]
    assert "".join(d.text for d in deltas) == expected.text
    assert [t for d in deltas for t in d.token_ids] == expected.token_ids
    last = deltas[-1]
    assert last.finished and last.request_finished and last.finish_reason == "length"
    assert last.num_prompt_tokens == len(prompt) and last.num_output_tokens == 12
    assert all(not d.finished for d in deltas[:-1])


async def test_concurrent_streams_and_stats(engine: AsyncEngine, tiny: TinyModel) -> None:
    prompts = random_prompts(tiny.tokenizer, 4, seed=21, min_len=40, max_len=40)
    prompts.append(prompts[0][:36] + [7, 8, 9])  # shares two full blocks with the first

    async def collect(i: int) -> list[int]:
        if i == 4:
            await asyncio.sleep(0.2)  # after the first prompt is cached
        return [t async for d in engine.stream(prompts[i], greedy(8)) for t in d.token_ids]

    outs = await asyncio.gather(*(collect(i) for i in range(5)))
    assert all(len(o) == 8 for o in outs)
    await wait_until(lambda: engine.stats().running == 0)
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.waiting == 0
    assert stats.kv_blocks_cached > 0 and stats.prefix_hit_tokens == 32
    assert stats.kv_blocks_total == stats.kv_blocks_used + stats.kv_blocks_cached + stats.kv_blocks_free
    assert stats.total_generated_tokens == 40 and stats.tokens_per_s > 0
    assert set(stats.as_dict()) >= {"running", "waiting", "prefix_hit_rate", "tokens_per_s"}


async def test_abort_by_id_ends_the_stream_and_frees_blocks(engine: AsyncEngine, tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=22)[0]
    deltas = []
    async for delta in engine.stream(prompt, greedy(500), request_id="x"):
        deltas.append(delta)
        if len(deltas) == 3:
            engine.abort("x")
    assert deltas[-1].finish_reason == "abort" and deltas[-1].request_finished
    assert len(deltas) < 50
    await wait_until(lambda: engine.stats().kv_blocks_used == 0)


async def test_breaking_out_of_the_stream_aborts_the_request(engine: AsyncEngine, tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=23)[0]
    async for _ in engine.stream(prompt, greedy(2000)):
        break  # the dropped generator is closed by asyncio's finaliser
    await wait_until(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_used == 0)
    stream = engine.stream(prompt, greedy(2000))
    async for _ in stream:
        break
    await stream.aclose()
    await wait_until(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_used == 0)
    assert engine.stats().total_generated_tokens < 1000


async def test_cancelling_the_consumer_task_aborts_the_request(engine: AsyncEngine, tiny: TinyModel) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=24)[0]
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.stream(prompt, greedy(2000)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_used == 0)


async def test_errors_are_raised_before_the_first_delta(tiny: TinyModel) -> None:
    config = EngineConfig(
        model=tiny.path, device="cpu", **{**TINY_ENGINE_DEFAULTS, "max_model_len": 32, "max_waiting": 0}
    )
    eng = AsyncEngine(config, loaded=tiny.loaded)
    try:
        with pytest.raises(PromptTooLongError):
            async for _ in eng.stream(list(range(100, 140)), greedy(4)):
                pass
        with pytest.raises(EngineOverloadedError):
            async for _ in eng.stream([1, 2, 3], greedy(4)):
                pass
        with pytest.raises(ValueError, match="temperature"):
            async for _ in eng.stream([1, 2, 3], SamplingParams(temperature=-1)):
                pass
    finally:
        eng.shutdown()


class RecordingSink:
    """A caller's own sink: records each item and the thread it was handed over on."""

    def __init__(self, fail: bool = False) -> None:
        self.items: list = []
        self.threads: set[int] = set()
        self.fail = fail
        self.finished = asyncio.get_running_loop().create_future()

    def put_nowait(self, item) -> None:
        self.items.append(item)
        self.threads.add(threading.get_ident())
        last = isinstance(item, BaseException) or item.request_finished
        if last and not self.finished.done():
            self.finished.set_result(None)
        if self.fail:
            raise RuntimeError("a sink that fails")


async def test_submit_hands_a_sinks_deltas_over_on_the_loop_and_a_failing_sink_spoils_no_other(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    prompts = random_prompts(tiny.tokenizer, 2, seed=23)
    streamed = [t async for d in engine.stream(prompts[0], greedy(10)) for t in d.token_ids]
    sink, failing = RecordingSink(), RecordingSink(fail=True)
    assert engine.submit(prompts[0], greedy(10), sink, "sunk") == "sunk"
    engine.submit(prompts[1], greedy(10), failing)
    await asyncio.wait_for(asyncio.gather(sink.finished, failing.finished), 30)
    assert [t for d in sink.items for t in d.token_ids] == streamed
    assert sink.items[-1].finish_reason == "length" and sink.threads == {threading.get_ident()}
    assert sum(len(d.token_ids) for d in failing.items) == 10  # every delta still came
    duplicate = RecordingSink()
    engine.submit(prompts[0], greedy(200), RecordingSink(), "twice")
    engine.submit(prompts[0], greedy(4), duplicate, "twice")
    await asyncio.wait_for(duplicate.finished, 30)
    assert isinstance(duplicate.items[-1], ValueError)  # the engine's refusal, as an item
    engine.abort("twice")
    with pytest.raises(PromptTooLongError):  # raised at once, nothing queued
        engine.submit(list(range(100, 100 + engine.max_model_len + 1)), greedy(4), RecordingSink())


async def test_idle_engine_thread_sleeps(engine: AsyncEngine) -> None:
    await asyncio.sleep(0.3)
    cpu = time.thread_time()  # this thread; the engine thread's use shows in process time
    before = time.process_time()
    await asyncio.sleep(0.5)
    assert time.process_time() - before - (time.thread_time() - cpu) < 0.1


async def test_purge_namespace_from_another_thread_drops_that_users_prefix_before_the_next_step(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=23, min_len=40, max_len=40)[0]

    async def cached(user: str) -> int:
        deltas = [d async for d in engine.stream(prompt, greedy(1), cache_namespace=user)]
        return deltas[-1].num_cached_tokens

    assert await cached("user:1") == 0
    assert await cached("user:1") == 32  # two full blocks before the last token
    dropped = await asyncio.wrap_future(await asyncio.to_thread(engine.purge_namespace, "user:1"))
    assert dropped >= 2
    assert await cached("user:1") == 0
