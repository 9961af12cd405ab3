"""Prefill workers as real processes on a tiny random-weight model: the same greedy
tokens as the colocated engine, blocks imported as prefix hits, and the faults (a killed
worker, a hung one, an abort, a full queue) losing nothing."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from inference.engine.llm_engine import LLMEngine
from inference.pd.scheduler import DisaggregatedScheduler
from inference.pd.workers import WorkerHandle
from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion

MIN_PROMPT = 64
READY_S = 180.0
SLOW_STEP_S = 1.0


@pytest.fixture(scope="module")
def pd_engine(tiny) -> Iterator[LLMEngine]:
    engine = tiny.engine(
        prefill_workers=1, pd_affinity="off", pd_min_prompt_tokens=MIN_PROMPT, pd_queue_size=8
    )
    assert engine.scheduler.workers.wait_ready(READY_S), "the prefill worker did not start"
    yield engine
    engine.close()


def _scheduler(engine: LLMEngine) -> DisaggregatedScheduler:
    assert isinstance(engine.scheduler, DisaggregatedScheduler)
    return engine.scheduler


def _worker(engine: LLMEngine) -> WorkerHandle:
    return _scheduler(engine).workers.workers[0]


def _respawn(engine: LLMEngine, step_delay_s: float) -> None:
    """Restart the worker slowed down by ``step_delay_s`` per step (a slow or hung worker)."""
    pool = _scheduler(engine).workers
    worker = pool.workers[0]
    worker.spec = dataclasses.replace(worker.spec, step_delay_s=step_delay_s)
    pool._restart(worker)
    assert pool.wait_ready(READY_S)


@pytest.fixture
def fresh(pd_engine: LLMEngine) -> Iterator[LLMEngine]:
    """The shared PD engine with a cold prefix cache."""
    pd_engine.block_manager.reset_prefix_cache()
    pool = _scheduler(pd_engine).workers
    timeout, queue_size = pool.timeout_s, pool.queue_size
    yield pd_engine
    pool.timeout_s, pool.queue_size = timeout, queue_size


@pytest.fixture
def slow(fresh: LLMEngine) -> LLMEngine:
    """The worker sleeps a second before each step (the fault tests come last in this
    module, so the fast tests never need a restart back)."""
    if _worker(fresh).spec.step_delay_s != SLOW_STEP_S:
        _respawn(fresh, SLOW_STEP_S)
    return fresh


def _run(engine: LLMEngine, prompts: list[Any], max_tokens: int = 10, **kw: Any) -> list[list[int]]:
    outputs = run_to_completion(engine, prompts, greedy(max_tokens), **kw)
    return [o.outputs[0].token_ids for o in outputs]


def _step_until(engine: LLMEngine, done: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        engine.step()


@pytest.mark.smoke
def test_greedy_tokens_identical_with_prefill_workers(tiny, fresh: LLMEngine) -> None:
    prompts = random_prompts(tiny.tokenizer, 3, seed=11, min_len=5, max_len=40) + random_prompts(
        tiny.tokenizer, 3, seed=12, min_len=150, max_len=400
    )
    prompts.append(prompts[3][:160])  # a multiple of the block size
    expected = _run(tiny.engine(), prompts)
    scheduler = _scheduler(fresh)
    before = scheduler.disaggregation_stats()
    requests = {}
    for i, prompt in enumerate(prompts):
        requests[i] = fresh.add_request(prompt, greedy(10), request_id=f"same-{i}")
    while fresh.has_unfinished():
        fresh.step()
    got = [fresh.request_output(requests[i]).outputs[0].token_ids for i in range(len(prompts))]
    assert got == expected
    stats = scheduler.disaggregation_stats()
    long = [i for i, p in enumerate(prompts) if len(p) > MIN_PROMPT]
    assert stats["imported_requests"] - before["imported_requests"] == len(long)
    assert stats["fallbacks_total"] == before["fallbacks_total"]
    bs = fresh.block_manager.block_size
    for i in long:
        # A prefix hit of every full block before the last token: only the tail ran here.
        assert requests[i].num_cached_tokens == (len(prompts[i]) - 1) // bs * bs
        # The worker's greedy first token is the engine's.
        assert scheduler.first_tokens[f"same-{i}"] == got[i][0]
    assert stats["transfer_bytes"] > before["transfer_bytes"]
    assert fresh.stats().disaggregation["queue_depth"] == 0


def test_salted_prompts_import_into_their_namespace(tiny, fresh: LLMEngine) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=21, min_len=300, max_len=300)[0]
    reference = tiny.engine()
    ref = reference.add_request(prompt, greedy(6), cache_namespace="user:1", cache_salt_from=32)
    while reference.has_unfinished():
        reference.step()
    request = fresh.add_request(prompt, greedy(6), cache_namespace="user:1", cache_salt_from=32)
    while fresh.has_unfinished():
        fresh.step()
    assert (
        fresh.request_output(request).outputs[0].token_ids
        == reference.request_output(ref).outputs[0].token_ids
    )
    assert request.num_cached_tokens > 0
    # Another user's identical prompt finds only the unsalted blocks before the salt.
    other = fresh.block_manager.match_prefix(
        fresh.sequences.new_request(
            "x", prompt, prompt, greedy(1), cache_namespace="user:2", cache_salt_from=32
        ).seqs[0]
    )
    assert len(other) == 2


def _purge_at_worker(engine: LLMEngine, namespace: str) -> int:
    """Purge ``namespace``; the blocks the worker then reports it dropped."""
    pool = _scheduler(engine).workers
    acks, blocks = pool.counters.purge_acks, pool.counters.purged_blocks
    engine.purge_namespace(namespace)
    deadline = time.monotonic() + 60
    while pool.counters.purge_acks == acks:
        assert time.monotonic() < deadline, "the worker never confirmed the purge"
        pool.poll()
        time.sleep(0.02)
    return pool.counters.purged_blocks - blocks


def test_purging_a_namespace_empties_the_workers_cache_too(tiny, fresh: LLMEngine) -> None:
    prompt = random_prompts(tiny.tokenizer, 1, seed=23, min_len=300, max_len=300)[0]
    request = fresh.add_request(prompt, greedy(2), cache_namespace="user:9", cache_salt_from=32)
    while fresh.has_unfinished():
        fresh.step()
    assert request.num_cached_tokens > 0  # its blocks came from the worker
    bs = fresh.block_manager.block_size
    salted = (len(prompt) - 1) // bs - 32 // bs  # full blocks from the salted one on
    assert _purge_at_worker(fresh, "user:9") >= salted
    assert _purge_at_worker(fresh, "user:9") == 0  # nothing of it left there
    assert _purge_at_worker(fresh, "user:8") == 0  # another namespace: nothing to drop


def test_abort_reaches_the_worker(tiny, slow: LLMEngine) -> None:
    fresh = slow
    scheduler = _scheduler(fresh)
    before = scheduler.disaggregation_stats()
    prompt = random_prompts(tiny.tokenizer, 1, seed=51, min_len=1200, max_len=1200)[0]
    fresh.add_request(prompt, greedy(10), request_id="stopped")
    assert "stopped" in scheduler.remote
    time.sleep(0.3)  # the job reaches the worker, which is now in its first (slow) step
    assert fresh.abort("stopped")
    deadline = time.monotonic() + 30
    while scheduler.disaggregation_stats()["abort_acks"] == before["abort_acks"]:
        assert time.monotonic() < deadline, "the worker never confirmed the abort"
        fresh.step()
        time.sleep(0.05)
    stats = scheduler.disaggregation_stats()
    assert stats["imported_requests"] == before["imported_requests"]
    assert stats["queue_depth"] == 0 and not scheduler.remote
    assert not fresh.has_unfinished()


def test_full_queues_prefill_locally(tiny, slow: LLMEngine) -> None:
    fresh = slow
    scheduler = _scheduler(fresh)
    scheduler.workers.queue_size = 2
    before = scheduler.disaggregation_stats()
    prompts = random_prompts(tiny.tokenizer, 4, seed=61, min_len=150, max_len=250)
    expected = _run(tiny.engine(), prompts)
    assert _run(fresh, prompts) == expected
    stats = scheduler.disaggregation_stats()
    assert stats["submitted"] - before["submitted"] == 2  # the queue holds two
    assert stats["local_busy"] - before["local_busy"] == 2


def test_killed_worker_falls_back_to_local_prefill(tiny, slow: LLMEngine) -> None:
    fresh = slow
    worker, scheduler = _worker(fresh), _scheduler(fresh)
    prompt = random_prompts(tiny.tokenizer, 1, seed=31, min_len=700, max_len=700)[0]
    expected = _run(tiny.engine(), [prompt])
    before = scheduler.disaggregation_stats()
    request = fresh.add_request(prompt, greedy(10), request_id="killed")
    assert "killed" in scheduler.remote
    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _step_until(fresh, lambda: request.is_finished)
    assert fresh.request_output(request).outputs[0].token_ids == expected[0]
    stats = scheduler.disaggregation_stats()
    assert stats["fallbacks"]["dead"] == before["fallbacks"]["dead"] + 1
    assert stats["restarts"] == before["restarts"] + 1
    assert scheduler.workers.wait_ready(READY_S)
    assert worker.pid != pid


def test_hung_worker_times_out_and_is_replaced(tiny, slow: LLMEngine) -> None:
    fresh, scheduler = slow, _scheduler(slow)
    scheduler.workers.timeout_s = 1.0
    prompt = random_prompts(tiny.tokenizer, 1, seed=41, min_len=200, max_len=200)[0]
    expected = _run(tiny.engine(), [prompt])
    before = scheduler.disaggregation_stats()
    request = fresh.add_request(prompt, greedy(10), request_id="hung")
    assert "hung" in scheduler.remote
    pid = _worker(fresh).pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive but silent: a hang
    try:
        _step_until(fresh, lambda: request.is_finished)
    finally:
        if _worker(fresh).pid == pid:
            os.kill(pid, signal.SIGKILL)
    assert fresh.request_output(request).outputs[0].token_ids == expected[0]
    stats = scheduler.disaggregation_stats()
    assert stats["fallbacks"]["hung"] == before["fallbacks"]["hung"] + 1
    assert stats["restarts"] == before["restarts"] + 1
    assert scheduler.workers.wait_ready(READY_S)


async def test_async_engine_streams_and_disconnects_with_prefill_workers(tiny) -> None:
    """Through the serving loop: a long prompt streams the colocated tokens, and a client
    that goes away while its prompt is at a worker leaves nothing behind."""
    import asyncio

    from inference.config import EngineConfig
    from inference.engine.async_engine import AsyncEngine
    from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS

    prompt, *candidates = random_prompts(tiny.tokenizer, 6, seed=71, min_len=400, max_len=500)
    expected = _run(tiny.engine(), [prompt], max_tokens=8)[0]
    config = EngineConfig(
        model=tiny.path,
        device="cpu",
        prefill_workers=1,
        pd_affinity="off",
        pd_min_prompt_tokens=MIN_PROMPT,
        **TINY_ENGINE_DEFAULTS,
    )
    engine = AsyncEngine(config, loaded=tiny.loaded)
    scheduler = _scheduler(engine.engine)
    try:
        assert await asyncio.to_thread(scheduler.workers.wait_ready, READY_S)
        tokens = [t async for delta in engine.stream(prompt, greedy(8)) for t in delta.token_ids]
        assert tokens == expected
        assert engine.stats().disaggregation["imported_requests"] == 1

        async def consume(prompt_ids: list[int], request_id: str) -> None:
            async for _ in engine.stream(prompt_ids, greedy(50), request_id=request_id):
                pass

        # The tiny model's prefill at the worker takes milliseconds: a request can come back
        # and finish between two looks, so another (uncached) prompt is tried until one is
        # seen at the worker.
        deadline = time.monotonic() + 30
        for attempt, gone in enumerate(candidates):
            request_id = f"gone-{attempt}"
            task = asyncio.create_task(consume(gone, request_id))
            while request_id not in scheduler.remote and not task.done():
                assert time.monotonic() < deadline, "no request reached the worker"
                await asyncio.sleep(0.001)
            if request_id in scheduler.remote:
                break
            await task
        else:
            raise AssertionError("every request finished before it was seen at the worker")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while engine.stats().disaggregation["queue_depth"] or engine.engine.has_unfinished():
            assert time.monotonic() < deadline + 30, "the disconnected request stayed"
            await asyncio.sleep(0.02)
        assert request_id not in engine.engine.requests
    finally:
        engine.shutdown()
