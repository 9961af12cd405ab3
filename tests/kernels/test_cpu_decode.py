"""The C decode-attention kernel (``chatsite_kernels.cpu.decode``) against ``paged_attention_ref``,
and the engine's CPU dispatch to it (or to the PyTorch path when it cannot be built).

The caches are fp32 or float16: a float16 cache is checked against the oracle run on
the same values upcast to fp32, and against the fp32 kernel on them (the same bits,
since only the loads differ)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from chatsite_kernels.cpu import decode as cpu_decode
from chatsite_kernels.reference import paged_attention_ref
from inference.layers import attention
from tests.kernels.cases import PagedBatch, make_batch, max_err, reference
from tests.support.fakes import build_context


@pytest.fixture(autouse=True)
def c_kernel_is_built() -> None:
    """gcc is part of the supported setup (README): a kernel that cannot be built here
    is a failure to see, not a reason to skip."""
    assert cpu_decode.available(), "the C decode kernel did not build (is gcc installed? see the log)"


# Contexts on, one before and one after block edges (16 and 32), a single token, and
# one long sequence (many blocks, many online-softmax rescales).
LENGTHS = [1, 15, 16, 17, 31, 32, 33, 64, 100, 1300]
ATOL = 2e-5


def cpu_batch(lengths: list[int], **kw) -> PagedBatch:
    """``make_batch`` with one query per sequence, always on the CPU; the order of the
    sequences is shuffled so long and short ones are interleaved."""
    lengths = list(lengths)
    random.Random(kw.get("seed", 0)).shuffle(lengths)
    batch = make_batch([(1, n) for n in lengths], **kw)
    if batch.pool.device.type == "cpu":
        return batch
    pool = batch.pool.cpu()
    return dataclasses.replace(
        batch,
        query=batch.query.cpu(),
        pool=pool,
        k_cache=pool[:, 0, 1],
        v_cache=pool[:, 1, 1],
        block_tables=batch.block_tables.cpu(),
        query_start_loc=batch.query_start_loc.cpu(),
        context_lens=batch.context_lens.cpu(),
    )


CACHE_DTYPES = [torch.float32, torch.float16]


def with_cache_dtype(batch: PagedBatch, dtype: torch.dtype) -> tuple[PagedBatch, PagedBatch]:
    """The batch with its pool in ``dtype`` (what the kernel reads), and the same values
    as fp32 (what the oracle reads)."""
    pool = batch.pool.to(dtype)
    upcast = pool.float()
    return (
        dataclasses.replace(batch, pool=pool, k_cache=pool[:, 0, 1], v_cache=pool[:, 1, 1]),
        dataclasses.replace(batch, pool=upcast, k_cache=upcast[:, 0, 1], v_cache=upcast[:, 1, 1]),
    )


def kernel(batch: PagedBatch) -> torch.Tensor:
    return cpu_decode.paged_decode_attention_cpu(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale
    )


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (9, 3), (16, 2)], ids=["mha", "gqa3", "gqa8"])
def test_kernel_matches_reference_over_shuffled_paged_blocks(
    block_size, head_dim, q_heads, kv_heads, cache_dtype
) -> None:
    batch = cpu_batch(LENGTHS, block_size=block_size, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
    batch, upcast = with_cache_dtype(batch, cache_dtype)
    assert not batch.k_cache.is_contiguous()  # a strided view of the pool, read in place
    out = kernel(batch)
    assert max_err(out, reference(upcast)) <= ATOL
    assert torch.equal(out, kernel(upcast))  # float16 loads are exact: the fp32 kernel's bits


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize(
    ("block_size", "head_dim"),
    [(64, 36), (48, 40), (8, 24)],
    ids=["tiles-inside-a-block-scalar-rows", "uneven-block-vector-rows", "small-block-narrow-rows"],
)
def test_kernel_handles_other_block_sizes_and_head_dims(block_size, head_dim, cache_dtype) -> None:
    """Blocks wider than one online-softmax tile (32), and head_dims that are not 64/128
    (vector path for multiples of 8, scalar path otherwise)."""
    batch = cpu_batch([1, 31, 32, 33, 47, 48, 49, 64, 65, 200], block_size=block_size, q_heads=6,
                      kv_heads=2, head_dim=head_dim, seed=3)  # fmt: skip
    batch, upcast = with_cache_dtype(batch, cache_dtype)
    out = kernel(batch)
    assert max_err(out, reference(upcast)) <= ATOL
    assert torch.equal(out, kernel(upcast))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_nan_in_stale_slots_past_each_length_does_not_leak(cache_dtype) -> None:
    batch = cpu_batch([1, 5, 16, 17, 40], block_size=16, q_heads=9, kv_heads=3, head_dim=64, seed=1)
    batch, upcast = with_cache_dtype(batch, cache_dtype)
    expected = reference(upcast)
    # Poison every slot that is not one of a sequence's first context_len positions:
    # the tails of last blocks, unused blocks, the table's padding block.
    live = torch.zeros(batch.pool.shape[0], batch.pool.shape[3], dtype=torch.bool)
    for table, length in zip(batch.block_tables.tolist(), batch.context_lens.tolist(), strict=True):
        for pos in range(length):
            live[table[pos // 16], pos % 16] = True
    batch.pool.permute(0, 3, 1, 2, 4, 5)[~live] = float("nan")
    out = kernel(batch)
    assert torch.isfinite(out).all()
    assert max_err(out, expected) <= ATOL


def test_results_do_not_depend_on_the_thread_count() -> None:
    batch = cpu_batch(LENGTHS, block_size=16, q_heads=9, kv_heads=3, head_dim=64, seed=2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(batch)
        torch.set_num_threads(max(2, threads))
        many = kernel(batch)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)  # each (sequence, kv head) is computed whole by one thread


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_successive_positions_of_one_sequence_get_the_bits_each_gets_alone(threads: int, cache_dtype) -> None:
    # A verify step's rows: one block table, lengths p + 1 .. p + R, read as one run.
    batch = cpu_batch([100], block_size=16, q_heads=9, kv_heads=3, head_dim=64, seed=5)
    batch, upcast = with_cache_dtype(batch, cache_dtype)
    rows = 20  # more than one work item's rows
    lengths = torch.arange(100 - rows + 1, 101, dtype=batch.context_lens.dtype)
    query = torch.randn(rows, 9, 64, generator=torch.Generator().manual_seed(5))
    tables = batch.block_tables[:1].expand(rows, -1).contiguous()
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        together = cpu_decode.paged_decode_attention_cpu(
            query, batch.k_cache, batch.v_cache, tables, lengths, batch.scale
        )
        alone = torch.cat(
            [
                cpu_decode.paged_decode_attention_cpu(
                    query[r : r + 1],
                    batch.k_cache,
                    batch.v_cache,
                    tables[:1],
                    lengths[r : r + 1],
                    batch.scale,
                )
                for r in range(rows)
            ]
        )
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(together, alone)
    expected = reference(dataclasses.replace(upcast, query=query[-1:]))
    assert max_err(together[-1:], expected) <= ATOL
    for r in (0, rows // 2):  # the other rows against the oracle too
        expected = paged_attention_ref(
            query[r : r + 1], upcast.k_cache, upcast.v_cache, tables[:1], torch.tensor([0, 1]),
            lengths[r : r + 1], batch.scale,
        )  # fmt: skip
        assert max_err(together[r : r + 1], expected) <= ATOL


def test_strided_query_is_accepted() -> None:
    batch = cpu_batch([3, 70, 18], block_size=16, q_heads=4, kv_heads=2, head_dim=64, seed=4)
    wide = torch.randn(3, 4, 2 * 64)
    wide[:, :, :64] = batch.query
    strided = dataclasses.replace(batch, query=wide[:, :, :64])  # rows 128 floats apart
    assert max_err(kernel(strided), reference(batch)) <= ATOL


def test_block_id_outside_the_cache_raises_instead_of_reading_it() -> None:
    batch = cpu_batch([20, 5], block_size=16, q_heads=4, kv_heads=2, head_dim=64)
    tables = batch.block_tables.clone()
    tables[0, 1] = batch.pool.shape[0]  # one past the last block
    with pytest.raises(ValueError, match="outside the cache"):
        kernel(dataclasses.replace(batch, block_tables=tables))
    too_long = batch.context_lens.clone()
    too_long[1] = batch.block_tables.shape[1] * 16 + 1
    with pytest.raises(ValueError, match="exceeds its block table"):
        kernel(dataclasses.replace(batch, context_lens=too_long))


# ---- dispatch in inference.layers.attention -----------------------------------------------------------


def decode_step(
    lengths: list[int],
    *,
    q_heads=6,
    kv_heads=2,
    head_dim=64,
    block_size=16,
    seed=0,
    cache_dtype=torch.float32,
):
    """A decode-only step through ``attention.paged_attention``: the new token's K/V
    is stored, then attended over with the rest of the cache."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    pool = torch.randn(num_blocks, 2, 1, block_size, kv_heads, head_dim, generator=gen).to(cache_dtype)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for n in lengths:
        tables.append([ids.pop() for _ in range(-(-n // block_size))])
    ctx = build_context(tables, [n - 1 for n in lengths], [1] * len(lengths), block_size)
    q = torch.randn(len(lengths), q_heads, head_dim, generator=gen)
    k = torch.randn(len(lengths), kv_heads, head_dim, generator=gen)
    v = torch.randn(len(lengths), kv_heads, head_dim, generator=gen)
    return q, k, v, pool[:, 0, 0], pool[:, 1, 0], ctx


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_cpu_decode_steps_use_the_kernel(monkeypatch, cache_dtype) -> None:
    calls = []
    real = cpu_decode.paged_decode_attention_cpu
    monkeypatch.setattr(cpu_decode, "paged_decode_attention_cpu", lambda *a: calls.append(1) or real(*a))
    q, k, v, k_cache, v_cache, ctx = decode_step([7, 40, 1, 33], cache_dtype=cache_dtype)
    out = attention.paged_attention(q, k, v, k_cache, v_cache, ctx, 0.125)
    assert k_cache.dtype == cache_dtype  # the new token's K/V were stored rounded into it
    ref = paged_attention_ref(
        q, k_cache.float(), v_cache.float(), ctx.block_tables, ctx.query_start_loc, ctx.context_lens, 0.125
    )
    assert calls
    assert max_err(out, ref) <= ATOL
