"""The engine's embedding path against transformers' mean pooling on the same weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from inference import AsyncEngine, EngineConfig, LLMEngine, PromptTooLongError
from inference.engine.pooling import batch_groups
from inference.runner.model_loader import load_model
from tests.support.fakes import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("embed") / "llama", arch="llama", seed=3)


@pytest.fixture(scope="module")
def engine(tiny_dir) -> LLMEngine:
    loaded = load_model(tiny_dir, device="cpu")
    return LLMEngine(
        EngineConfig(model=str(tiny_dir), num_kv_blocks=64, max_num_batched_tokens=64), loaded=loaded
    )


def hf_mean_pooled(tiny_dir, inputs: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for ids in inputs:
            hidden = hf(input_ids=torch.tensor([ids])).last_hidden_state[0]
            rows.append(torch.nn.functional.normalize(hidden.mean(0), dim=-1))
    return torch.stack(rows)


@pytest.mark.smoke
def test_mean_pooling_matches_transformers(engine: LLMEngine, tiny_dir) -> None:
    texts = ["The whale surfaced.", "Call me Ishmael. Some years ago, never mind how long", "a"]
    inputs = [engine.tokenizer.encode(t) for t in texts]
    inputs.append(list(range(5, 100)))  # longer than one batch group of 64 tokens: alone
    ours = engine.embed(inputs)
    theirs = hf_mean_pooled(tiny_dir, inputs)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-3)
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(inputs)), atol=1e-5)


def test_batch_order_does_not_change_a_vector(engine: LLMEngine) -> None:
    a, b = engine.tokenizer.encode("first input here"), engine.tokenizer.encode("second")
    together = engine.embed([a, b])
    torch.testing.assert_close(together[0], engine.embed([a])[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(together[1], engine.embed([b, a])[0], atol=1e-5, rtol=1e-4)


def test_embedding_keeps_no_kv_block(engine: LLMEngine) -> None:
    before = engine.stats()
    engine.embed([engine.tokenizer.encode("nothing of this is cached " * 4)])
    after = engine.stats()
    assert (after.kv_blocks_used, after.kv_blocks_cached) == (before.kv_blocks_used, before.kv_blocks_cached)


def test_too_long_and_empty_inputs_are_refused(engine: LLMEngine) -> None:
    with pytest.raises(PromptTooLongError):
        engine.embed([[1] * (engine.max_model_len + 5)])
    with pytest.raises(ValueError):
        engine.embed([[]])


def test_batch_groups() -> None:
    assert batch_groups([3, 3, 3, 10, 1], 6) == [[0, 1], [2], [3], [4]]


def test_async_embed_runs_between_steps(tiny_dir) -> None:
    """Embeddings asked while answers stream come back right and the answers finish."""
    from inference import SamplingParams

    loaded = load_model(tiny_dir, device="cpu")
    reference = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64), loaded=loaded)
    engine = AsyncEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64), loaded=loaded)
    ids = engine.tokenizer.encode("embed me while you generate")

    async def main():
        async def answer():
            params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
            return [d async for d in engine.stream("hello there", params)]

        task = asyncio.create_task(answer())
        vectors = await asyncio.gather(*(engine.embed([ids]) for _ in range(4)))
        return await task, vectors

    try:
        deltas, vectors = asyncio.run(main())
    finally:
        engine.shutdown()
    assert sum(len(d.token_ids) for d in deltas) == 12
    expected = reference.embed([ids])
    for v in vectors:
        torch.testing.assert_close(v, expected, atol=1e-5, rtol=1e-4)
