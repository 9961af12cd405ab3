"""The CPU attention path (decode through the C kernel or the batched PyTorch code,
looped prefill) equals the oracle ``chatsite_kernels.reference.paged_attention_ref``."""

from __future__ import annotations

import random

import pytest
import torch

from chatsite_kernels.cpu import decode as cpu_decode
from chatsite_kernels.reference import paged_attention_ref, store_kv_ref
from inference.layers import attention
from tests.support.fakes import build_context


def random_case(lens_new: list[int], lens_cached: list[int], q_heads: int, kv_heads: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    block_size, head_dim, num_blocks = 4, 16, 96
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))  # unused slots hold NaN: they must never leak
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = []
    for new, cached in zip(lens_new, lens_cached, strict=True):
        tables.append([free.pop() for _ in range(-(-(new + cached) // block_size))])
    # Fill the cached prefixes.
    for table, cached in zip(tables, lens_cached, strict=True):
        if cached:
            pre = build_context([table], [0], [cached], block_size)
            k = torch.randn(cached, kv_heads, head_dim, generator=gen)
            store_kv_ref(k, torch.randn(k.shape, generator=gen), k_cache, v_cache, pre.slot_mapping)
    ctx = build_context(tables, lens_cached, lens_new, block_size)
    total = sum(lens_new)
    q = torch.randn(total, q_heads, head_dim, generator=gen)
    k = torch.randn(total, kv_heads, head_dim, generator=gen)
    v = torch.randn(total, kv_heads, head_dim, generator=gen)
    return q, k, v, k_cache, v_cache, ctx


@pytest.fixture(params=["c-kernel", "torch"])
def decode_path(request, monkeypatch) -> str:
    """Runs a test over both CPU decode paths: the C kernel and the PyTorch fallback."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_decode, "supports", lambda *args: False)
    else:  # gcc is part of the supported setup (README): failing to build is a defect
        assert cpu_decode.available(), "the C decode kernel did not build (is gcc installed?)"
    return request.param


@pytest.mark.parametrize(
    ("lens_new", "lens_cached", "q_heads", "kv_heads"),
    [
        ([1, 1, 1, 1], [0, 5, 17, 40], 6, 2),  # decode-only, GQA, very different lengths
        ([1] * 9, [3, 8, 1, 30, 12, 4, 4, 63, 20], 4, 4),  # decode-only, MHA
        ([5, 1, 7], [0, 9, 13], 6, 3),  # mixed prefill/decode, one fresh prefill
    ],
)
def test_cpu_attention_matches_reference_and_ignores_stale_slots(
    lens_new, lens_cached, q_heads, kv_heads, decode_path
) -> None:
    q, k, v, k_cache, v_cache, ctx = random_case(lens_new, lens_cached, q_heads, kv_heads)
    scale = 16**-0.5
    ours = attention.paged_attention(q, k, v, k_cache, v_cache, ctx, scale)
    ref = paged_attention_ref(
        q, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
    )
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_batched_decode_splits_large_batches_into_chunks(monkeypatch) -> None:
    monkeypatch.setattr(cpu_decode, "supports", lambda *args: False)  # the PyTorch path
    monkeypatch.setattr(attention, "_DECODE_GATHER_BUDGET", 2000)  # forces several chunks
    q, k, v, k_cache, v_cache, ctx = random_case([1] * 7, [2, 30, 9, 9, 50, 1, 22], 4, 2, seed=5)
    ours = attention.paged_attention(q, k, v, k_cache, v_cache, ctx, 0.25)
    ref = paged_attention_ref(
        q, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, 0.25
    )
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
