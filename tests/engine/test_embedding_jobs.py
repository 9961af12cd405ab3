"""Embeddings are engine work budgeted like prefill: advanced a chunk per turn between steps
(so a stream keeps getting tokens while a long request is embedded), counted in the owner's
fair share, and queued with a bound."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
import torch

from inference import AsyncEngine, EngineConfig, EngineOverloadedError, LLMEngine, SamplingParams
from inference.engine.embedding_jobs import EmbedJob, advance, fit_chunk
from inference.engine.step_budget import MIN_CHUNK, StepBudget
from inference.runner.model_loader import load_model
from tests.engine.test_embeddings import hf_mean_pooled
from tests.support.fakes import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("embed-jobs") / "llama", arch="llama", seed=3)


@pytest.fixture(scope="module")
def loaded(tiny_dir):
    return load_model(tiny_dir, device="cpu")


def config(tiny_dir, **overrides) -> EngineConfig:
    return EngineConfig(model=str(tiny_dir), num_kv_blocks=256, max_num_batched_tokens=64, **overrides)


def test_chunked_embeddings_match_transformers(tiny_dir, loaded) -> None:
    """Inputs longer than a turn's tokens run as chunks against their own cached tokens;
    short ones are packed whole: the vectors are transformers' mean pooling either way."""
    engine = LLMEngine(config(tiny_dir), loaded=loaded)
    inputs = [list(range(5, 300)), [7, 8, 9], list(range(40, 101)), list(range(3, 200, 2))]
    job = EmbedJob(inputs, "alice", Future())
    engine.embeddings.admit(job.num_tokens, "alice")
    engine.add_embedding(job)
    turns = 0
    while not job.done.done():
        assert engine.embed_turn()
        turns += 1
    assert turns >= sum(len(x) for x in inputs) // 64  # never more than a step's tokens a turn
    torch.testing.assert_close(job.done.result(), hf_mean_pooled(tiny_dir, inputs), atol=2e-4, rtol=1e-3)
    assert engine.embeddings.queued_tokens == 0 and not engine.embeddings
    assert engine.scheduler.external_seats == {}


def test_a_stream_keeps_getting_tokens_while_a_long_embedding_runs(tiny_dir, loaded) -> None:
    """Run whole between two steps, the embedding held every stream until it was done; in
    chunks, the stream's deltas keep coming while it runs."""
    engine = AsyncEngine(config(tiny_dir), loaded=loaded, stream_interval=0)
    inputs = [list(range(5, 500)) for _ in range(8)]  # 3,960 tokens: dozens of turns

    async def main() -> tuple[int, int]:
        deltas_during = 0
        started = asyncio.Event()
        embedding: asyncio.Future | None = None

        async def answer() -> int:
            nonlocal deltas_during
            count = 0
            params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
            async for delta in engine.stream("hello there", params, owner="bob"):
                count += len(delta.token_ids)
                started.set()
                if embedding is not None and not embedding.done():
                    deltas_during += 1
            return count

        task = asyncio.create_task(answer())
        await started.wait()
        embedding = asyncio.ensure_future(engine.embed(inputs, owner="alice"))
        vectors = await embedding
        assert vectors.shape[0] == 8
        return await task, deltas_during

    try:
        tokens, deltas_during = asyncio.run(main())
    finally:
        engine.shutdown()
    assert tokens == 400
    assert deltas_during >= 10, f"only {deltas_during} deltas reached the stream while embedding"


def test_the_queue_is_bounded_in_all_and_per_owner(tiny_dir, loaded) -> None:
    engine = AsyncEngine(
        config(tiny_dir, embed_max_queued_tokens=1000, embed_max_queued_tokens_per_owner=600), loaded=loaded
    )
    engine.engine.embed_turn = lambda: True  # nothing advances: the queue only fills

    async def main() -> None:
        engine.embed_future([list(range(5, 505))], owner="alice")  # 500
        with pytest.raises(EngineOverloadedError, match="this user already has 500 tokens"):
            engine.embed_future([list(range(5, 205))], owner="alice")
        engine.embed_future([list(range(5, 405))], owner="bob")  # 900 in all
        with pytest.raises(EngineOverloadedError, match="900 tokens are already waiting"):
            engine.embed_future([list(range(5, 205))], owner="carol")

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_an_owner_embedding_counts_in_the_fair_share(tiny_dir, loaded) -> None:
    """One seat free, a request of each owner waiting: the owner with an embedding in
    progress waits behind the one without, whoever came first."""
    engine = LLMEngine(config(tiny_dir, max_num_seqs=1), loaded=loaded)
    job = EmbedJob([list(range(5, 100))], "alice", Future())
    engine.embeddings.admit(job.num_tokens, "alice")
    engine.add_embedding(job)
    first = engine.add_request([5, 6, 7], SamplingParams(max_tokens=2), owner="alice")
    second = engine.add_request([8, 9, 10], SamplingParams(max_tokens=2), owner="bob")
    engine.step()
    assert second in engine.scheduler.running and first not in engine.scheduler.running


def test_a_cancelled_job_is_dropped_and_its_tokens_released(tiny_dir, loaded) -> None:
    """A caller that goes away (a client disconnected) cancels its future: the next turn drops
    the job instead of embedding for nobody."""
    engine = LLMEngine(config(tiny_dir), loaded=loaded)
    job = EmbedJob([list(range(5, 400))], "alice", Future())
    engine.embeddings.admit(job.num_tokens, "alice")
    engine.add_embedding(job)
    assert engine.embed_turn() and not job.done.done()  # part-way through
    assert job.done.cancel()
    assert engine.embed_turn()
    assert not engine.embeddings and engine.embeddings.queued_tokens == 0
    assert engine.scheduler.external_seats == {}


def test_a_carried_input_is_chunked_by_the_time_its_last_chunk_took(tiny_dir, loaded) -> None:
    """Deep in a long input a token costs more than a step's prompt token: the next chunk is
    cut to what fits the seconds at the rate the previous chunk of that input ran."""
    engine = LLMEngine(config(tiny_dir), loaded=loaded)
    job = EmbedJob([list(range(5, 300))], "alice", Future())
    assert fit_chunk(job, 64, 0.1) == 64  # nothing carried yet: the step budget's tokens
    advance(job, engine.model, 64, block_size=16, device="cpu", dtype=torch.float32)
    assert job.carry is not None and job.carry.computed == 64
    assert job.carry.s_per_token is not None and job.carry.s_per_token > 0
    job.carry.s_per_token = 0.004  # 4 ms a token, as deep in a long input on a slow machine
    assert fit_chunk(job, 200, 0.2) == 50
    assert fit_chunk(job, 40, 0.2) == 40  # never more than the budget's tokens
    assert fit_chunk(job, 200, 0.0) == MIN_CHUNK  # the input still progresses
    assert fit_chunk(job, 200, None) == 200  # no budget to keep to


def test_chunk_seconds_follow_the_measured_prefill_rate() -> None:
    budget = StepBudget(budget_s=0.15, max_tokens=2048)
    budget.decode_step_s = 0.05
    assert budget.chunk_seconds(100) == pytest.approx(0.10)  # nothing measured: the spare
    budget.prefill_s_per_token = 0.001
    assert budget.chunk_seconds(100) == pytest.approx(0.1)
    assert budget.chunk_seconds(30) == pytest.approx(0.03)
    assert StepBudget(budget_s=0, max_tokens=2048).chunk_seconds(100) is None
