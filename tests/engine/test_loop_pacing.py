"""AsyncEngine paces itself to the event loops it hands deltas to: while a loop is still
working through a hand-over the engine does not step (its tokens would only age in the
loop's queue), but a loop that stays behind (stalled, or gone without closing) does not
slow the streams of the others."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from inference.config import EngineConfig
from inference.engine.async_engine import AsyncEngine
from inference.engine.mailbox import Mailbox
from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS, TinyModel, greedy, random_prompts

INTERVAL = 0.05  # a loop behind for longer is not waited for


@pytest.fixture
def engine(tiny: TinyModel) -> Iterator[AsyncEngine]:
    config = EngineConfig(model=tiny.path, device="cpu", **TINY_ENGINE_DEFAULTS)
    eng = AsyncEngine(config, loaded=tiny.loaded, stream_interval=INTERVAL)
    yield eng
    eng.shutdown()


def record_steps(engine: AsyncEngine) -> list[float]:
    """The start time of every engine step from now on."""
    starts: list[float] = []
    step = engine.engine.step

    def timed_step(emit: bool = True):
        starts.append(time.monotonic())
        return step(emit)

    engine.engine.step = timed_step  # type: ignore[method-assign]
    return starts


async def test_the_engine_does_not_step_while_its_loop_is_busy_with_a_hand_over(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    steps = record_steps(engine)
    prompt = random_prompts(tiny.tokenizer, 1, seed=60)[0]
    busy: tuple[float, float] | None = None
    deltas = []
    async for delta in engine.stream(prompt, greedy(40)):
        deltas.append(delta)
        if len(deltas) == 1:
            started = time.monotonic()
            time.sleep(INTERVAL / 2)  # the loop busy (blocked) with the first hand-over
            busy = (started, time.monotonic())
    assert busy is not None and deltas[-1].num_output_tokens == 40
    during = [t for t in steps if busy[0] <= t < busy[1]]
    assert during == [], f"{len(during)} steps ran while the loop could not take their tokens"
    assert len([t for t in steps if t >= busy[1]]) >= 39  # the rest ran once it caught up


async def test_the_tasks_woken_by_those_a_hand_over_wakes_count_as_its_work(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    """As a chat answer's task hands each delta on to its websockets' writers."""
    steps = record_steps(engine)
    prompt = random_prompts(tiny.tokenizer, 1, seed=62)[0]
    relay: Mailbox = Mailbox()
    busy: list[tuple[float, float]] = []

    async def writer() -> None:
        while await relay.get() is not None:
            if not busy:
                started = time.monotonic()
                time.sleep(INTERVAL / 2)  # the loop busy writing the first delta
                busy.append((started, time.monotonic()))

    writing = asyncio.create_task(writer())
    async for delta in engine.stream(prompt, greedy(40)):
        relay.put_nowait(delta)
    relay.put_nowait(None)
    await writing
    during = [t for t in steps if busy[0][0] <= t < busy[0][1]]
    assert during == [], f"{len(during)} steps ran while the loop was still writing a hand-over"


async def test_a_stalled_loop_does_not_slow_the_streams_of_another(
    engine: AsyncEngine, tiny: TinyModel
) -> None:
    prompts = random_prompts(tiny.tokenizer, 2, seed=61)
    got_first, release = threading.Event(), threading.Event()

    async def stalled_reader() -> None:
        stream = engine.stream(prompts[0], greedy(4000))
        await anext(stream)
        got_first.set()
        release.wait(30)  # blocks its loop: it never takes another hand-over meanwhile
        await stream.aclose()

    other = threading.Thread(target=asyncio.run, args=(stalled_reader(),))
    other.start()
    try:
        assert await asyncio.to_thread(got_first.wait, 30)
        steps = record_steps(engine)
        count = 120
        # Were every step held for the stalled loop, these would take count * INTERVAL (6 s).
        started = time.monotonic()
        deltas = [d async for d in engine.stream(prompts[1], greedy(count))]
        elapsed = time.monotonic() - started
        assert not release.is_set()
        assert deltas[-1].num_output_tokens == count
        assert elapsed < count * INTERVAL / 3, f"{count} tokens took {elapsed:.1f} s beside a stalled loop"
        assert len(steps) >= count
    finally:
        release.set()
        await asyncio.to_thread(other.join, 30)


def test_a_hand_over_to_a_loop_that_is_not_running_is_not_waited_for(engine: AsyncEngine) -> None:
    """As a loop closed between a hand-over and its last callback leaves it: never taken."""
    idle = asyncio.new_event_loop()
    try:
        engine._deliver({idle: [(Mailbox(), object())]})
        started = time.monotonic()
        assert engine._wait_for_loops(30.0)
        assert time.monotonic() - started < 5
    finally:
        idle.close()
