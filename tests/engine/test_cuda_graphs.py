"""CUDA graphs for decode steps: size choice, static padded inputs, and their use by the
engine. Capture needs a GPU; everything else runs here on CPU, where
``CUDAGraphRunner.use_static_eager()`` runs the very forward a graph records (the
model over the first rows of the static, padded buffers) without capturing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chatsite_kernels.reference import paged_attention_ref, store_kv_ref
from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.layers import gqa_attention
from inference.runner.cuda_graphs import (
    MAX_GRAPH_BATCH,
    CUDAGraphRunner,
    StaticDecodeInputs,
    graph_batch_sizes,
    pick_graph_size,
)
from inference.runner.model_loader import load_model
from inference.runner.packed_batch import PackedBatch
from tests.engine.engine_fixtures import TINY_ENGINE_DEFAULTS, greedy, random_prompts, run_to_completion
from tests.support.fakes import allocate_kv_cache, build_context

ROOT = Path(__file__).resolve().parents[2]
BS = 16


@pytest.fixture
def reference_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route the model's attention through ``chatsite_kernels.reference``, the oracle whose
    semantics the Triton kernels (the graphs' attention) have, including for padding
    rows of context length 0. The CPU fast path never sees such rows in service."""

    def attention(q, k, v, k_cache, v_cache, ctx, scale, kv_stored=False):  # type: ignore[no-untyped-def]
        if not kv_stored:
            store_kv_ref(k, v, k_cache, v_cache, ctx.slot_mapping)
        return paged_attention_ref(
            q, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
        )

    monkeypatch.setattr(gqa_attention, "paged_attention", attention)


def decode_batch(
    tables: list[list[int]], cached: list[int], tokens: list[int], device: torch.device | str = "cpu"
) -> PackedBatch:
    """A decode-only step: sequence i has ``cached[i]`` tokens in the pool and adds ``tokens[i]``."""
    n = len(tokens)
    return PackedBatch(
        input_ids=torch.tensor(tokens, device=device),
        positions=torch.tensor(cached, device=device),
        ctx=build_context(tables, cached, [1] * n, BS, device),
        sample_rows=torch.arange(n, device=device),
        sampled=list(range(n)),
    )


# ---- batch sizes ------------------------------------------------------------------------------


def test_graph_sizes_are_powers_of_two_to_eight_then_multiples_of_eight():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]


def test_graph_sizes_include_the_largest_batch_and_stop_at_the_bound():
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(10_000)[-1] == MAX_GRAPH_BATCH
    assert graph_batch_sizes(100, limit=30) == [1, 2, 4, 8, 16, 24, 30]
    assert graph_batch_sizes(0) == []


def test_pick_graph_size_takes_the_smallest_size_holding_the_batch():
    sizes = graph_batch_sizes(64)
    assert [pick_graph_size(sizes, b) for b in (1, 2, 3, 5, 8, 9, 17, 64)] == [1, 2, 4, 8, 8, 16, 24, 64]
    assert pick_graph_size(sizes, 65) is None
    assert pick_graph_size(sizes, 0) is None


# ---- static inputs ----------------------------------------------------------------------------


def test_load_copies_the_step_and_makes_the_remaining_rows_harmless_padding():
    inputs = StaticDecodeInputs.allocate(max_batch=8, max_blocks=6, device="cpu")
    # Leftovers of an earlier batch of 8: real slots and lengths in every row.
    inputs.load(decode_batch([[7, 1, 4]] * 8, [40] * 8, [9] * 8), size=8)
    step = decode_batch([[3], [5, 2], [6]], [4, 20, 0], [11, 12, 13])
    inputs.load(step, size=4)

    assert inputs.input_ids[:3].tolist() == [11, 12, 13]
    assert inputs.positions[:3].tolist() == [4, 20, 0]
    assert inputs.slot_mapping[:3].tolist() == [3 * BS + 4, 2 * BS + 4, 6 * BS]
    assert inputs.context_lens[:3].tolist() == [5, 21, 1]
    assert inputs.block_tables[:3, :2].tolist() == [[3, 0], [5, 2], [6, 0]]
    # Row 3 pads the batch to the graph of size 4: it must neither store K/V nor read any.
    assert inputs.slot_mapping[3].item() == -1
    assert inputs.context_lens[3].item() == 0
    assert inputs.query_start_loc[:5].tolist() == [0, 1, 2, 3, 4]


def test_graph_context_views_the_buffers_with_constant_host_values():
    inputs = StaticDecodeInputs.allocate(max_batch=8, max_blocks=6, device="cpu")
    ctx = inputs.context(4, BS)
    assert ctx.is_decode_only
    assert ctx.max_context_len == 6 * BS  # bounds every replay's lengths
    assert ctx.block_tables.shape == (4, 6) and ctx.query_start_loc.shape == (5,)
    inputs.load(decode_batch([[2]], [3], [5]), size=4)
    assert ctx.context_lens[0].item() == 4 and ctx.slot_mapping[0].item() == 2 * BS + 3  # same memory


def test_only_decode_steps_within_the_buffers_fit():
    inputs = StaticDecodeInputs.allocate(max_batch=4, max_blocks=2, device="cpu")
    assert inputs.fits(decode_batch([[1], [2, 3]], [3, 20], [5, 6]))
    assert not inputs.fits(decode_batch([[1]] * 5, [3] * 5, [5] * 5))  # batch too large
    assert not inputs.fits(decode_batch([[1, 2, 3]], [40], [5]))  # table wider than the buffer
    prefill = PackedBatch(
        input_ids=torch.tensor([5, 6, 7]),
        positions=torch.tensor([0, 1, 2]),
        ctx=build_context([[1]], [0], [3], BS, "cpu"),
        sample_rows=torch.tensor([2]),
        sampled=[0],
    )
    assert not inputs.fits(prefill)


# ---- the recorded forward, run eagerly on the static inputs -----------------------------------


def check_padded_replay(model: torch.nn.Module, prepare: str, tol: float) -> None:
    """Decode steps through ``CUDAGraphRunner`` (``prepare``: "use_static_eager" or
    "capture") against the eager forward on a copy of the pool: same hidden rows, same
    pool, and padding rows store nothing."""
    config, device = model.config, next(model.parameters()).device
    tables = [[4, 9], [2], [7, 1, 3], [5, 8]]
    prompt_lens = [20, 9, 33, 17]
    pool = allocate_kv_cache(config, 12, BS, torch.float32, device)
    pool.normal_()  # unwritten slots hold noise, so any stray write or read would show
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        prompts = [torch.randint(100, 40000, (n,), generator=gen) for n in prompt_lens]
        model(
            torch.cat(prompts).to(device),
            torch.cat([torch.arange(n) for n in prompt_lens]).to(device),
            build_context(tables, [0] * 4, prompt_lens, BS, device),
            pool,
        )
    before = pool.clone()
    graphs = CUDAGraphRunner(model, pool, BS, max_batch=8, max_blocks=4)
    getattr(graphs, prepare)()
    assert torch.equal(pool, before), "preparing the graphs must not touch the pool"
    eager_pool = pool.clone()

    # A batch of 4 (graph size 4), then 3 of them (size 4 again: row 3 is now padding
    # whose leftover slot belongs to the dropped sequence), then 1.
    for rows in ([0, 1, 2, 3], [0, 1, 2], [2]):
        cached = [prompt_lens[i] for i in rows]
        step = decode_batch([tables[i] for i in rows], cached, [100 + i for i in rows], device)
        with torch.inference_mode():
            expected = model(step.input_ids, step.positions, step.ctx, eager_pool)
            hidden = graphs.run(step)
        assert hidden.shape == expected.shape
        torch.testing.assert_close(hidden, expected, rtol=tol, atol=tol)
        torch.testing.assert_close(pool, eager_pool, rtol=tol, atol=tol)
        for i in rows:
            prompt_lens[i] += 1
    assert graphs.num_replays == 3

    # Only the slots the steps' real tokens went to changed (padding stored nothing).
    written = torch.zeros(pool.shape[0], BS, dtype=torch.bool, device=device)
    for table, start, end in zip(tables, [20, 9, 33, 17], prompt_lens, strict=True):
        for pos in range(start, end):
            written[table[pos // BS], pos % BS] = True
    # [blocks, bs]: the slot is unchanged in every layer, K and V.
    unchanged = (pool == before).permute(0, 3, 1, 2, 4, 5).flatten(2).all(-1)
    assert torch.equal(unchanged, ~written)


def test_padded_static_forward_matches_eager_and_writes_no_padding_kv(tiny, reference_attention):
    check_padded_replay(tiny.loaded[0], "use_static_eager", tol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_captured_graphs_replay_new_steps_like_eager_on_gpu(tiny):
    model, _, _ = load_model(tiny.path, device="cuda", dtype="float32")
    check_padded_replay(model, "capture", tol=1e-4)


def test_run_refuses_steps_without_a_graph(tiny):
    model, _, config = tiny.loaded
    graphs = CUDAGraphRunner(
        model, allocate_kv_cache(config, 8, BS, torch.float32), BS, max_batch=2, max_blocks=2
    )
    step = decode_batch([[1]], [3], [5])
    assert not graphs.can_run(step)  # nothing captured yet
    graphs.use_static_eager()
    assert graphs.can_run(step)
    with pytest.raises(ValueError, match="no decode graph"):
        graphs.run(decode_batch([[1]] * 3, [3] * 3, [5] * 3))


def test_engine_decoding_through_static_graph_inputs_matches_eager_greedy(tiny, reference_attention):
    prompts = random_prompts(tiny.tokenizer, 7, seed=11)
    # Staggered arrivals and lengths: mixed steps (eager) and decode-only batches that
    # shrink as requests finish, so padding rows reuse rows of finished sequences.
    params = [greedy(max_tokens=3 + 4 * i) for i in range(7)]
    arrivals = [0, 0, 1, 3, 6, 10, 11]
    expected = run_to_completion(tiny.engine(), prompts, params, arrivals)

    engine = tiny.engine()
    runner = engine.runner
    max_blocks = -(-engine.max_model_len // runner.block_size)
    graphs = CUDAGraphRunner(runner.model, runner.kv_cache, runner.block_size, 32, max_blocks)
    graphs.use_static_eager()
    runner.cuda_graphs = graphs
    outputs = run_to_completion(engine, prompts, params, arrivals)

    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    assert graphs.num_replays >= 10
    assert engine.stats().extra["cuda_graph_steps"] == graphs.num_replays


# ---- configuration ----------------------------------------------------------------------------


def test_enforce_eager_defaults_off_and_must_be_a_bool():
    assert EngineConfig().enforce_eager is False
    assert EngineConfig.from_kwargs(enforce_eager=True).enforce_eager is True
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="false")  # type: ignore[arg-type]


def test_cpu_engine_never_captures_cuda_graphs(tiny, monkeypatch):
    def no_capture(self: CUDAGraphRunner) -> None:
        raise AssertionError("CUDA graph capture attempted on CPU")

    monkeypatch.setattr(CUDAGraphRunner, "capture", no_capture)
    engine = tiny.engine(enforce_eager=False)
    assert engine.runner.cuda_graphs is None
    outputs = run_to_completion(engine, random_prompts(tiny.tokenizer, 2, seed=1), greedy(max_tokens=3))
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    assert "cuda_graph_steps" not in engine.stats().extra


def test_engine_enforce_eager_env_variable_reaches_the_engine_config():
    probe = (
        "import django, json; django.setup(); from django.conf import settings as s;"
        "from inference.config import EngineConfig;"
        "c = EngineConfig(**{k: v for k, v in s.ENGINE.items() if v is not None});"
        "print(json.dumps(c.enforce_eager))"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    values = []
    for setting in ("", "true", "0"):
        env.update(ENGINE_ENFORCE_EAGER=setting, DJANGO_SETTINGS_MODULE="chatsite.settings")
        result = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        values.append(json.loads(result.stdout))
    assert values == [False, True, False]


# ---- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_cuda_graph_engine_matches_eager_greedy_on_gpu(tiny):
    model, tokenizer, config = load_model(tiny.path, device="cuda", dtype="float32")
    prompts = random_prompts(tokenizer, 7, seed=11)
    params = [greedy(max_tokens=3 + 4 * i) for i in range(7)]
    arrivals = [0, 0, 1, 3, 6, 10, 11]
    results = {}
    for eager in (True, False):
        cfg = EngineConfig(model=tiny.path, device="cuda", enforce_eager=eager, **TINY_ENGINE_DEFAULTS)
        engine = LLMEngine(cfg, loaded=(model, tokenizer, config))
        assert (engine.runner.cuda_graphs is None) == eager
        outputs = run_to_completion(engine, prompts, params, arrivals)
        results[eager] = [o.outputs[0].token_ids for o in outputs]
        if not eager:
            assert engine.runner.cuda_graphs.num_replays >= 10
        del engine
        torch.cuda.empty_cache()
    assert results[False] == results[True]
