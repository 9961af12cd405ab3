"""Sliding windows, logit soft-caps and attention sinks in the attention kernels: the C
decode kernel (``chatsite_kernels.cpu.decode``) and the Triton decode and prefill
kernels (under the interpreter without a GPU) against the PyTorch path,
``inference.layers.window_attention.feature_attention_torch``. The C kernel also
reads float16 caches, checked against the PyTorch path on the values upcast."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from chatsite_kernels.cpu import decode as cpu_decode
from inference.layers.window_attention import AttentionFeatures, feature_attention, feature_attention_torch
from tests.kernels.cases import DEVICE, INTERPRET, PagedBatch, make_batch, max_err
from tests.support.fakes import build_context

ATOL = 2e-5
# A block id no cache has: a kernel that read a block before the window would fail
# (the C kernel checks ids) or read far outside the pool.
OUTSIDE = 1 << 30

FEATURES = {
    "window": AttentionFeatures(window=20),
    "softcap": AttentionFeatures(softcap=2.0),
    "sinks": "sinks",
    "all": "all",
}


def features_for(name: str, q_heads: int) -> AttentionFeatures:
    """The case's features; sinks are drawn per case (one per query head)."""
    sinks = torch.linspace(-3.0, 4.0, q_heads)
    if name == "sinks":
        return AttentionFeatures(sinks=sinks)
    if name == "all":
        return AttentionFeatures(window=37, softcap=2.0, sinks=sinks)
    return FEATURES[name]  # type: ignore[return-value]


def batch_for(
    pairs: list[tuple[int, int]], features: AttentionFeatures, device: torch.device, **kw
) -> PagedBatch:
    """``make_batch`` on ``device`` whose table entries before each sequence's first
    query's window are ids outside the cache (a sliding group's dropped blocks)."""
    batch = make_batch(pairs, **kw)
    tables = batch.block_tables.cpu().clone()
    if features.window is not None:
        block_size = batch.k_cache.shape[1]
        for i, (q_len, kv_len) in enumerate(pairs):
            lo = max(0, kv_len - q_len - features.window + 1)
            tables[i, : lo // block_size] = OUTSIDE
    pool = batch.pool.to(device)
    return dataclasses.replace(
        batch,
        query=batch.query.to(device),
        pool=pool,
        k_cache=pool[:, 0, 1],
        v_cache=pool[:, 1, 1],
        block_tables=tables.to(device),
        query_start_loc=batch.query_start_loc.to(device),
        context_lens=batch.context_lens.to(device),
    )


CACHE_DTYPES = [torch.float32, torch.float16]


def with_cache_dtype(batch: PagedBatch, dtype: torch.dtype) -> tuple[PagedBatch, PagedBatch]:
    """The batch with its pool in ``dtype`` (for the C kernel), and the same values as
    fp32 (for the PyTorch path)."""
    pool = batch.pool.to(dtype)
    upcast = pool.float()
    return (
        dataclasses.replace(batch, pool=pool, k_cache=pool[:, 0, 1], v_cache=pool[:, 1, 1]),
        dataclasses.replace(batch, pool=upcast, k_cache=upcast[:, 0, 1], v_cache=upcast[:, 1, 1]),
    )


def c_kernel(batch: PagedBatch, features: AttentionFeatures) -> torch.Tensor:
    return cpu_decode.paged_decode_attention_cpu(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale,
        window=features.window, softcap=features.softcap, sinks=features.sinks,
    )  # fmt: skip


def torch_path(batch: PagedBatch, features: AttentionFeatures) -> torch.Tensor:
    sinks = features.sinks.to(batch.query.device) if features.sinks is not None else None
    return feature_attention_torch(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
        dataclasses.replace(features, sinks=sinks),
    )


# Contexts shorter than, equal to and longer than the windows, on and off block edges.
DECODE_LENGTHS = [1, 19, 20, 21, 36, 37, 38, 64, 100, 300]


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("name", list(FEATURES))
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((4, 4), 40), ((16, 2), 128)])
def test_c_decode_kernel_matches_the_torch_path(name, heads, head_dim, cache_dtype):
    assert cpu_decode.available(), "the C decode kernel did not build (is gcc installed?)"
    features = features_for(name, heads[0])
    batch = batch_for(
        [(1, n) for n in DECODE_LENGTHS],
        features,
        torch.device("cpu"),
        block_size=16,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=head_dim,
    )
    batch, upcast = with_cache_dtype(batch, cache_dtype)
    out = c_kernel(batch, features)
    assert max_err(out, torch_path(upcast, features)) <= ATOL
    assert torch.equal(out, c_kernel(upcast, features))  # float16 loads are exact


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_c_decode_kernel_runs_of_one_sequence_see_their_own_windows(cache_dtype):
    """Verify rows (one sequence at successive positions) share their K/V reads in the
    kernel; each still attends within its own window."""
    features = AttentionFeatures(window=20, sinks=torch.randn(9))
    pairs = [(1, n) for n in range(30, 42)]
    batch = batch_for(pairs, features, torch.device("cpu"), block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    same = batch.block_tables[-1:].expand_as(batch.block_tables).clone()
    same[:, :1] = 0  # the longest row's dropped block is the shorter rows' first: keep it readable
    batch, upcast = with_cache_dtype(dataclasses.replace(batch, block_tables=same), cache_dtype)
    out = c_kernel(batch, features)
    assert max_err(out, torch_path(upcast, features)) <= ATOL


def test_c_decode_kernel_refuses_a_block_its_window_reads_outside_the_cache():
    features = AttentionFeatures(window=20)
    batch = batch_for(
        [(1, 64)], features, torch.device("cpu"), block_size=16, q_heads=9, kv_heads=3, head_dim=64
    )
    tables = batch.block_tables.clone()
    tables[0, 3] = OUTSIDE  # positions 48..63: inside the window
    with pytest.raises(ValueError, match="outside the cache"):
        cpu_decode.paged_decode_attention_cpu(
            batch.query, batch.k_cache, batch.v_cache, tables, batch.context_lens, batch.scale, window=20
        )


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_cpu_decode_steps_of_featured_layers_take_the_c_kernel(monkeypatch, cache_dtype):
    """``feature_attention`` sends a CPU decode step (fp32 query, fp32 or float16 cache)
    to the C kernel with the layer's features, and its result is the PyTorch path's."""
    features = AttentionFeatures(window=20, softcap=2.0, sinks=torch.randn(9))
    lengths = [5, 40, 77]
    batch = batch_for([(1, n) for n in lengths], features, torch.device("cpu"), block_size=16, q_heads=9,
                      kv_heads=3, head_dim=64)  # fmt: skip
    batch, _ = with_cache_dtype(batch, cache_dtype)
    tables = batch.block_tables.clamp(max=batch.k_cache.shape[0] - 1).tolist()
    ctx = build_context(tables, [n - 1 for n in lengths], [1] * len(lengths), 16)
    ctx.block_tables = batch.block_tables
    calls = []
    original = cpu_decode.paged_decode_attention_cpu
    monkeypatch.setattr(
        cpu_decode, "paged_decode_attention_cpu", lambda *a, **kw: calls.append(kw) or original(*a, **kw)
    )
    key = torch.randn(len(lengths), 3, 64)
    value = torch.randn(len(lengths), 3, 64)
    out = feature_attention(batch.query, key, value, batch.k_cache, batch.v_cache, ctx, batch.scale, features)
    assert calls and calls[0]["window"] == 20 and calls[0]["softcap"] == 2.0
    _, upcast = with_cache_dtype(batch, cache_dtype)  # after the step stored its K/V
    assert max_err(out, torch_path(upcast, features)) <= ATOL


# ---- Triton (compiled on a GPU, the interpreter on the CPU) ---------------------------------

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or (DEVICE.type == "cpu" and not INTERPRET),
    reason="triton is not installed, or no GPU and TRITON_INTERPRET is not 1",
)


@needs_triton
@pytest.mark.parametrize("name", list(FEATURES))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_decode_matches_the_torch_path(name, num_splits):
    from chatsite_kernels.triton import ops

    features = features_for(name, 9)
    batch = batch_for([(1, n) for n in (1, 20, 38, 150)], features, DEVICE, block_size=16, q_heads=9,
                      kv_heads=3, head_dim=64)  # fmt: skip
    sinks = features.sinks.to(DEVICE) if features.sinks is not None else None
    out = ops.paged_decode_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale,
        num_splits=num_splits, block_n=16, window=features.window, softcap=features.softcap, sinks=sinks,
    )  # fmt: skip
    assert max_err(out, torch_path(batch, features)) <= ATOL


@needs_triton
@pytest.mark.parametrize("name", list(FEATURES))
def test_triton_prefill_matches_the_torch_path(name):
    from chatsite_kernels.triton import ops

    features = features_for(name, 9)
    # A decode row past the window, a prefill longer than the window, an extend over a
    # prefix whose first blocks left the window.
    pairs = [(1, 90), (45, 45), (20, 83)]
    batch = batch_for(pairs, features, DEVICE, block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    sinks = features.sinks.to(DEVICE) if features.sinks is not None else None
    out = ops.paged_prefill_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc,
        batch.context_lens, batch.scale, block_m=32, block_n=16,
        window=features.window, softcap=features.softcap, sinks=sinks,
    )  # fmt: skip
    assert max_err(out, torch_path(batch, features)) <= ATOL
