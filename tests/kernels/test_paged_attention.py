"""Paged decode and prefill/extend attention against ``paged_attention_ref``."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.cases import ATOL, DEVICE, make_batch, max_err, reference, requires_backend

requires_backend()
triton_ops = pytest.importorskip("chatsite_kernels.triton.ops")

# (q_heads, kv_heads): GQA ratios 3 (SmolLM2), 1 and 8.
SMOLLM2 = (9, 3)
MHA = (4, 4)
GQA8 = (16, 2)


def prefill(batch, **kw) -> torch.Tensor:
    return triton_ops.paged_prefill_attention(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
        **kw,
    )


def decode(batch, **kw) -> torch.Tensor:
    return triton_ops.paged_decode_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale, **kw
    )


# ---- prefill / extend ------------------------------------------------------------------------

PREFILL_CASES = [
    # The vLLM mix in one batch: a decode row on a long context, a short extend, a long
    # extend over a prefix that is not block aligned (463 = 28 * 16 + 15).
    pytest.param([(1, 1328), (5, 18), (129, 463)], 16, SMOLLM2, 64, id="mixed-bs16-gqa3-d64"),
    # Block boundaries: contexts that end exactly on, one before and one after a block
    # edge, a prefill that starts on an edge, and a pure prefill (q_len == context_len).
    pytest.param(
        [(32, 32), (1, 31), (3, 33), (16, 64), (1, 1), (20, 65)], 32, GQA8, 128, id="edges-bs32-gqa8-d128"
    ),
    pytest.param([(17, 17), (1, 16), (16, 48), (7, 40)], 16, MHA, 64, id="edges-bs16-mha-d64"),
    pytest.param([(40, 40), (9, 100), (1, 2)], 32, SMOLLM2, 128, id="bs32-gqa3-d128"),
    # A head size that is not a power of two (Phi-3-mini, Phi-4-mini: 96; masked lanes).
    pytest.param([(1, 70), (20, 20), (9, 41)], 16, (24, 8), 96, id="phi-gqa3-d96"),
]


@pytest.mark.parametrize(("pairs", "block_size", "heads", "head_dim"), PREFILL_CASES)
def test_prefill_matches_reference(pairs, block_size, heads, head_dim):
    batch = make_batch(pairs, block_size=block_size, q_heads=heads[0], kv_heads=heads[1], head_dim=head_dim)
    assert not batch.k_cache.is_contiguous()  # a strided view of the pool, as in the engine
    out = prefill(batch)
    assert out.shape == batch.query.shape
    assert max_err(out, reference(batch)) <= ATOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_16bit(dtype):
    batch = make_batch(
        [(1, 70), (12, 12), (23, 50)], block_size=16, q_heads=9, kv_heads=3, head_dim=64, dtype=dtype
    )
    out = prefill(batch)
    assert out.dtype == dtype
    assert max_err(out, reference(batch)) <= ATOL[dtype]


def test_prefill_tile_size_does_not_matter():
    """Small tiles put several tiles in one sequence and a sequence across tile starts."""
    batch = make_batch([(13, 29), (1, 5), (30, 30)], block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    ref = reference(batch)
    for block_m, block_n in [(16, 16), (64, 64), (128, 32)]:
        assert max_err(prefill(batch, block_m=block_m, block_n=block_n), ref) <= ATOL[torch.float32]


def test_prefill_skips_empty_sequences():
    batch = make_batch([(3, 10), (0, 20), (4, 4)], block_size=16, q_heads=4, kv_heads=4, head_dim=64)
    assert max_err(prefill(batch), reference(batch)) <= ATOL[torch.float32]


# ---- decode ----------------------------------------------------------------------------------

DECODE_LENS = [1, 15, 16, 17, 31, 32, 33, 300, 1328]


@pytest.mark.parametrize(
    ("lens", "block_size", "heads", "head_dim"),
    [
        pytest.param(DECODE_LENS, 16, SMOLLM2, 64, id="bs16-gqa3-d64"),
        pytest.param(DECODE_LENS, 32, GQA8, 128, id="bs32-gqa8-d128"),
        pytest.param([1, 16, 33, 200], 16, MHA, 128, id="bs16-mha-d128"),
        pytest.param([64, 65, 95], 32, MHA, 64, id="bs32-mha-d64"),
        pytest.param([1, 17, 33, 200], 16, (24, 8), 96, id="phi-gqa3-d96"),
    ],
)
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_decode_matches_reference(lens, block_size, heads, head_dim, num_splits):
    batch = make_batch(
        [(1, n) for n in lens], block_size=block_size, q_heads=heads[0], kv_heads=heads[1], head_dim=head_dim
    )
    out = decode(batch, num_splits=num_splits)
    assert out.shape == batch.query.shape
    assert max_err(out, reference(batch)) <= ATOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_16bit(dtype):
    batch = make_batch(
        [(1, n) for n in (1, 17, 700)], block_size=16, q_heads=9, kv_heads=3, head_dim=64, dtype=dtype
    )
    out = decode(batch, num_splits=3)
    assert out.dtype == dtype
    assert max_err(out, reference(batch)) <= ATOL[dtype]


def test_decode_split_bound_from_host_hint():
    """``max_context_len`` narrows the split count; results must not change."""
    batch = make_batch([(1, n) for n in (5, 90, 260)], block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    ref = reference(batch)
    assert max_err(decode(batch, max_context_len=260, num_splits=4), ref) <= ATOL[torch.float32]
    assert max_err(decode(batch, max_context_len=260, block_n=16), ref) <= ATOL[torch.float32]


def test_decode_accepts_strided_query():
    """Q sliced out of a fused QKV projection is not contiguous."""
    batch = make_batch([(1, 40), (1, 3)], block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    qkv = torch.randn(2, (9 + 6) * 64, device=DEVICE)
    batch.query = qkv[:, : 9 * 64].view(2, 9, 64)
    assert not batch.query.is_contiguous()
    assert max_err(decode(batch), reference(batch)) <= ATOL[torch.float32]
    assert max_err(prefill(batch), reference(batch)) <= ATOL[torch.float32]


def test_decode_empty_context_gives_zeros():
    """A padded CUDA-graph slot (context_len 0) must not produce NaN."""
    batch = make_batch([(1, 20), (1, 1)], block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    batch.context_lens[1] = 0
    for splits in (1, 2):
        out = decode(batch, num_splits=splits)
        assert torch.isfinite(out).all()
        assert out[1].abs().max().item() == 0.0


def test_decode_and_prefill_agree_on_decode_batches():
    batch = make_batch([(1, n) for n in (1, 16, 17, 129)], block_size=16, q_heads=9, kv_heads=3, head_dim=64)
    assert max_err(decode(batch, num_splits=2), prefill(batch)) <= ATOL[torch.float32]
