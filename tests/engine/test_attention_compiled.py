"""The Inductor-fused CPU decode attention equals the reference, ignores stale (NaN)
slots, and the engine turns it on by default (falling back to eager if it cannot)."""

from __future__ import annotations

import random

import pytest
import torch

from inference import attention, attention_compiled
from inference.sampling_params import SamplingParams
from inference.testing import build_context
from kernels.reference import paged_attention_ref
from tests.engine.engine_fixtures import TinyModel


@pytest.fixture(scope="module")
def fused():
    pool = torch.zeros(32, 2, 2, 4, 2, 16)  # [NB, 2, layers, bs, Hkv, D]
    fn = attention_compiled.install(pool, num_q_heads=6, scale=0.25)
    if fn is None:
        pytest.skip("Inductor cannot compile here (no C++ compiler?)")
    return fn


@pytest.mark.parametrize("lens", [[1], [5, 17, 40, 3], [63, 1, 20, 20, 9, 33]])
def test_fused_decode_attention_matches_the_reference_and_ignores_stale_slots(fused, lens: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(lens))
    block_size, kv_heads, head_dim, q_heads, num_blocks = 4, 2, 16, 6, 64
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    free = list(range(1, num_blocks))
    random.Random(0).shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lens]
    for table, n in zip(tables, lens, strict=True):  # slots past each length hold NaN
        k_cache[table[-1], n - (len(table) - 1) * block_size :] = float("nan")
        v_cache[table[-1], n - (len(table) - 1) * block_size :] = float("nan")
    ctx = build_context(tables, [n - 1 for n in lens], [1] * len(lens), block_size)
    query = torch.randn(len(lens), q_heads, head_dim, generator=gen)
    got = fused(query, k_cache, v_cache, ctx.block_tables, ctx.context_lens, 0.25)
    want = paged_attention_ref(
        query, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, 0.25
    )
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_engine_uses_the_fused_kernel_only_inside_its_own_forward(fused, tiny: TinyModel) -> None:
    engine = tiny.engine()
    assert engine.runner.fused_decode is not None
    assert tiny.engine(compile_attention=False).runner.fused_decode is None
    seen = []
    original = engine.runner.fused_decode
    engine.runner.fused_decode = lambda *args: seen.append(1) or original(*args)
    engine.add_request([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert seen  # decode steps went through it
    assert getattr(attention._override, "fn", None) is None  # and nothing leaked outside
