"""CPU prefill attention with the context's ``cpu_bf16``: chunks of at least ``MIN_ROWS``
query rows run SDPA on bf16 operands, stay within bf16's rounding of the fp32 oracle
``paged_attention_ref``, and an engine with ``cpu_matmul="bf16"`` still gives HF's greedy tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from chatsite_kernels.reference import paged_attention_ref
from inference.layers import attention
from inference.layers.cpu_matmul import MIN_ROWS
from tests.engine.engine_fixtures import TinyModel, greedy, run_to_completion
from tests.engine.test_paged_attention_cpu import random_case

# Largest |bf16 path - fp32 oracle| measured on these unit-variance inputs was 1.3e-2
# (a first causal row copies one V row: |v| up to ~4 times bf16's 2^-9 relative
# rounding, then the output's own rounding); fp32 itself is within 1e-6.
BF16_ATOL = 3e-2


@pytest.fixture
def sdpa_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, torch.dtype]]:
    """(query rows, operand dtype) of every SDPA call from here on, through
    ``F.scaled_dot_product_attention`` or the flash kernel the bf16 path calls itself."""
    calls: list[tuple[int, torch.dtype]] = []

    def spying(real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            calls.append((q.shape[-2], q.dtype))
            return real(q, *args, **kwargs)

        return spy

    monkeypatch.setattr(F, "scaled_dot_product_attention", spying(F.scaled_dot_product_attention))
    if attention._flash_with_lse is not None:
        monkeypatch.setattr(attention, "_flash_with_lse", spying(attention._flash_with_lse))
    return calls


@pytest.mark.parametrize(
    ("lens_new", "lens_cached", "q_heads", "kv_heads"),
    [
        # decodes + prefill chunks of 16 (a whole number of blocks), 17 and 40 after
        # cached prefixes ending mid-block and on a block boundary, GQA 3:1
        ([1, 16, 1, 17, 40, 1], [9, 12, 31, 3, 0, 64], 6, 2),
        # MHA; a fresh prompt of exactly MIN_ROWS, a short chunk (stays fp32), a long one
        ([MIN_ROWS, 5, 1, 70], [0, 20, 7, 33], 4, 4),
    ],
)
@pytest.mark.parametrize("merged", [True, False], ids=["prefix-merged", "masked"])
def test_bf16_prefill_attention_is_within_bf16_rounding_of_the_oracle(
    lens_new, lens_cached, q_heads, kv_heads, merged, sdpa_dtypes, monkeypatch
) -> None:
    if merged:
        assert attention._flash_with_lse is not None, "this torch lacks the CPU flash kernel's op"
    else:  # a torch without it: the masked SDPA call
        monkeypatch.setattr(attention, "_flash_with_lse", None)
    q, k, v, k_cache, v_cache, ctx = random_case(lens_new, lens_cached, q_heads, kv_heads, seed=3)
    scale = 16**-0.5
    fp32 = attention.paged_attention(q, k, v, k_cache, v_cache, ctx, scale)  # also stores K/V
    assert {dtype for _, dtype in sdpa_dtypes} == {torch.float32}
    ref = paged_attention_ref(
        q, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
    )
    torch.testing.assert_close(fp32, ref, atol=1e-5, rtol=1e-5)

    sdpa_dtypes.clear()
    ours = attention.paged_attention(q, k, v, k_cache, v_cache, replace(ctx, cpu_bf16=True), scale)
    assert ours.dtype == torch.float32
    assert torch.isfinite(ours).all()  # the NaN in unused cache slots never leaks
    # SDPA calls of each prefill chunk's rows (the decodes go through the C kernel or
    # query rows of one head group, which no chunk here matches in length).
    prefill = {(n, torch.bfloat16 if n >= MIN_ROWS else torch.float32) for n in lens_new if n > 1}
    assert prefill <= set(sdpa_dtypes)
    assert not {(n, dt) for n, dt in sdpa_dtypes if any(n == p for p, _ in prefill)} - prefill
    err = (ours - ref).abs()
    assert err.max().item() <= BF16_ATOL
    # Rows of short chunks and of decodes keep fp32's exactness.
    starts = ctx.query_start_loc.tolist()
    for i, n in enumerate(lens_new):
        if n < MIN_ROWS:
            torch.testing.assert_close(ours[starts[i] : starts[i + 1]], ref[starts[i] : starts[i + 1]])


def test_engine_with_bf16_cpu_matmul_gives_hf_greedy_tokens(tiny: TinyModel, sdpa_dtypes) -> None:
    """Prompts longer than MIN_ROWS, prefilled in chunks (some after a cached prefix),
    then a second turn over the first one's cached history."""
    import random

    rng = random.Random(11)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (40, 23, 90)]
    params = greedy(10)
    expected = [tiny.hf_greedy(p, 10) for p in prompts]
    engine = tiny.engine(cpu_matmul="bf16", max_num_batched_tokens=48, enable_prefix_caching=True)
    sdpa_dtypes.clear()
    outs = run_to_completion(engine, prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert any(dtype == torch.bfloat16 for _, dtype in sdpa_dtypes)

    second = prompts[0] + expected[0] + [rng.randrange(100, 40000) for _ in range(30)]
    second_expected = tiny.hf_greedy(second, 10)
    out = run_to_completion(engine, [second], params)[0]
    assert out.outputs[0].token_ids == second_expected
