"""Embedding turns are paid from a hard share of the engine's time while requests run:
a fake clock stands for the steps and the chunks, so nothing here is timed."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from inference import EngineConfig, LLMEngine, SamplingParams
from inference.engine.embedding_jobs import EmbedJob
from inference.engine.embedding_share import EmbeddingShare
from inference.runner.model_loader import load_model
from tests.support.fakes import make_tiny_model_dir


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_turn_waits_until_its_share_of_the_steps_is_earned() -> None:
    clock = FakeClock()
    share = EmbeddingShare(turn_s=0.05, share=0.2, clock=clock)
    assert share.allowance(busy=True) == 0.0  # nothing earned yet
    clock.now += 0.1  # a step of 100 ms earns 20 ms
    assert share.allowance(busy=True) == 0.0
    clock.now += 0.15  # 50 ms earned: one turn's worth
    assert share.allowance(busy=True) == pytest.approx(0.05)
    clock.now += 0.05
    share.charge(100)
    assert share.credit_s == pytest.approx(0.0)
    assert share.s_per_token == pytest.approx(0.0005)
    assert share.tokens(0.05, fallback=32, least=32) == 100


def test_a_chunk_that_overran_is_paid_back_before_the_next_turn() -> None:
    clock = FakeClock()
    share = EmbeddingShare(turn_s=0.05, share=0.2, clock=clock)
    share.allowance(busy=True)
    clock.now += 0.25
    assert share.allowance(busy=True) == pytest.approx(0.05)
    clock.now += 0.2  # planned 50 ms, took 200 (deep in a long input, a busy machine)
    share.charge(32)
    assert share.credit_s == pytest.approx(-0.15)
    clock.now += 0.9  # 180 ms earned: the debt and not yet a whole turn
    assert share.allowance(busy=True) == 0.0
    clock.now += 0.1
    assert share.allowance(busy=True) == pytest.approx(0.05)


def test_with_nothing_running_a_turn_has_no_limit_and_no_credit_is_hoarded() -> None:
    clock = FakeClock()
    share = EmbeddingShare(turn_s=0.05, share=0.2, clock=clock)
    share.allowance(busy=True)
    clock.now += 60.0  # a minute of steps: the credit stops at one turn
    assert share.allowance(busy=True) == pytest.approx(0.05)
    assert share.allowance(busy=False) is None
    clock.now += 60.0
    assert share.allowance(busy=True) == 0.0  # counting starts again when requests run


def test_over_many_steps_embedding_takes_at_most_its_share() -> None:
    """Steps of 30 ms, chunks costing 3 ms a token (four times what was measured at
    first): whatever the estimate, the embedding time stays within its share plus one chunk."""
    clock = FakeClock()
    share = EmbeddingShare(turn_s=0.075, share=0.2, clock=clock)
    share.s_per_token = 0.00075
    stepping = embedding = 0.0
    for _ in range(2000):
        clock.now += 0.03
        stepping += 0.03
        seconds = share.allowance(busy=True)
        if seconds:
            tokens = share.tokens(seconds, fallback=32, least=32)
            clock.now += tokens * 0.003
            embedding += tokens * 0.003
            share.charge(tokens)
    assert embedding > 0
    assert embedding <= 0.2 * stepping + 0.075 * 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("embed-share") / "llama", arch="llama", seed=3)


def test_while_a_stream_runs_an_embedding_job_runs_only_on_its_share(tiny_dir) -> None:
    """After every step the engine offers the embeddings a turn; with a stream running,
    a job advances only when the steps have earned it, by what fits the credit."""
    config = EngineConfig(model=str(tiny_dir), num_kv_blocks=256, max_num_batched_tokens=64)
    engine = LLMEngine(config, loaded=load_model(tiny_dir, device="cpu"))
    clock = FakeClock()
    engine.embedding_share.clock = clock
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True), owner="bob")
    job = EmbedJob([list(range(5, 300))], "alice", Future())
    engine.embeddings.admit(job.num_tokens, "alice")
    engine.add_embedding(job)
    turn_s = engine.embedding_share.turn_s
    assert turn_s > 0
    ran = []
    for _ in range(4):
        engine.step()
        clock.now += 0.01  # a 10 ms step earns 2 ms
        ran.append(engine.embed_turn())
    assert ran == [False] * 4
    assert job.next_index == 0 and job.carry is None  # not started
    real_advance = engine._advance_embedding

    def advance_taking_a_turn(job: EmbedJob, tokens: int) -> int:
        clock.now += turn_s  # the chunk takes its whole turn
        return real_advance(job, tokens)

    engine._advance_embedding = advance_taking_a_turn
    clock.now += turn_s / engine.embedding_share.share  # the steps have earned one turn
    engine.step()
    assert engine.embed_turn()
    assert job.carry is not None and job.carry.computed > 0
    engine.step()
    assert not engine.embed_turn()  # its credit is spent
