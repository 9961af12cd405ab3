"""The C per-layer ops (``chatsite_kernels.cpu.layer_ops``) against their PyTorch definitions:
RMSNorm with a fused residual add, rotary embedding + K/V store (into an fp32 or a
float16 cache, the latter bit for bit what ``.to(torch.float16)`` stores), greedy argmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from chatsite_kernels.reference import store_kv_ref
from inference.layers.rotary import apply_rotary


@pytest.fixture(autouse=True)
def c_kernel_is_built() -> None:
    assert cpu_layer_ops.available(), "the C layer-ops kernels did not build (is gcc installed? see the log)"


@pytest.mark.parametrize(("rows", "width"), [(1, 576), (7, 64), (300, 576), (3, 13)])
def test_rms_norm_matches_torch(rows: int, width: int) -> None:
    gen = torch.Generator().manual_seed(rows * width)
    x, w = torch.randn(rows, width, generator=gen) * 3, torch.randn(width, generator=gen)
    torch.testing.assert_close(cpu_layer_ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (width,), w, 1e-5))


def test_rms_norm_keeps_leading_dimensions() -> None:
    x, w = torch.randn(2, 3, 40), torch.randn(40)
    torch.testing.assert_close(cpu_layer_ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (40,), w, 1e-5))


def test_rms_norm_adds_the_residual_in_place_first() -> None:
    x, residual, w = torch.randn(5, 96), torch.randn(5, 96), torch.randn(96)
    expected_sum = residual + x
    out = cpu_layer_ops.rms_norm(x, w, 1e-6, residual=residual)
    assert torch.equal(residual, expected_sum)  # the same float additions as torch's
    torch.testing.assert_close(out, F.rms_norm(expected_sum, (96,), w, 1e-6))


def test_rms_norm_refuses_a_residual_of_another_shape() -> None:
    with pytest.raises(ValueError, match="residual"):
        cpu_layer_ops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, residual=torch.zeros(3, 8))


def rope_rows(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float16 tensor's bit patterns (NaNs compare equal when their bits do)."""
    return t.view(torch.int16)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 16), (8, 1, 128)])
def test_rotary_store_matches_rotating_then_storing(
    heads: int, kv_heads: int, head_dim: int, cache_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(heads + head_dim)
    tokens, block_size, num_blocks, layers = 6, 4, 5, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.tensor([0, 1, 2, 17, 40, 3])
    slots = torch.tensor([3, 4, -1, 19, 0, 9])  # -1: not stored (CUDA-graph padding)
    cos_sin = rope_rows(positions, head_dim)
    # Strided views of a block-major pool, as the engine passes them.
    pool = torch.full(
        (num_blocks, 2, layers, block_size, kv_heads, head_dim), float("nan"), dtype=cache_dtype
    )
    ref_pool = pool.clone()

    q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
    cos, sin = cos_sin[:, None, : head_dim // 2], cos_sin[:, None, head_dim // 2 :]
    q_ref = apply_rotary(qkv[:, :q_end].reshape(tokens, heads, head_dim), cos, sin)
    k_ref = apply_rotary(qkv[:, q_end:k_end].reshape(tokens, kv_heads, head_dim), cos, sin)
    v_ref = qkv[:, k_end:].reshape(tokens, kv_heads, head_dim).clone()
    store_kv_ref(k_ref, v_ref, ref_pool[:, 0, 1], ref_pool[:, 1, 1], slots)

    cpu_layer_ops.rotary_store(qkv, heads, kv_heads, cos_sin, slots, pool[:, 0, 1], pool[:, 1, 1])
    torch.testing.assert_close(qkv[:, :q_end].view(tokens, heads, head_dim), q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        qkv[:, q_end:k_end].view(tokens, kv_heads, head_dim), k_ref, rtol=1e-6, atol=1e-6
    )
    assert torch.equal(qkv[:, k_end:].view(tokens, kv_heads, head_dim), v_ref)  # v is not rotated
    tol = 1e-6 if cache_dtype == torch.float32 else 1e-3  # float16: within one rounding
    torch.testing.assert_close(pool, ref_pool, rtol=tol, atol=tol, equal_nan=True)
    assert torch.isnan(pool[:, :, 0]).all()  # the other layer is untouched
    # The kernel's own rotated k and its v, stored by PyTorch: the same bits.
    own_pool = torch.full_like(pool, float("nan"))
    k_own = qkv[:, q_end:k_end].reshape(tokens, kv_heads, head_dim)
    store_kv_ref(k_own, v_ref, own_pool[:, 0, 1], own_pool[:, 1, 1], slots)
    assert torch.equal(pool.view(-1).view(torch.int8), own_pool.view(-1).view(torch.int8))


# float32 values whose float16 rounding has edges: the largest half (65504), the
# halfway point to the next power of two (65520, a tie that rounds up to inf), past
# it, the smallest subnormal (2^-24), ties below it (2^-25 -> 0, 3 * 2^-25 -> 2^-23),
# the normal boundary, signed zeros, infinities and NaNs with payloads.
EDGES = [
    65504.0, 65519.996, 65520.0, 65536.0, 1e6, -65504.0, -65520.0,
    2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-25 * 1.0000001, 1e-10, 2.0**-14, 2.0**-14 * (1 - 2.0**-11),
    6.1e-5, -(2.0**-24), 0.0, -0.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
    float("inf"), float("-inf"), float("nan"),
]  # fmt: skip
NAN_BITS = [0x7F800001, 0xFFC12345, 0x7FA00001]  # a signalling NaN, payloads


def edge_values(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` floats: the edges and NaN payloads, then random values over many scales."""
    nans = torch.tensor(NAN_BITS, dtype=torch.int64).to(torch.int32).view(torch.float32)
    scales = 10.0 ** torch.randint(-9, 6, (n,), generator=gen).float()
    values = torch.randn(n, generator=gen) * scales
    edges = torch.cat([torch.tensor(EDGES), nans])
    values[: len(edges)] = edges[:n]
    return values


@pytest.mark.parametrize(("tokens", "head_dim"), [(3, 64), (70, 12)], ids=["decode", "parallel-odd-tail"])
def test_rotary_store_into_float16_rounds_as_torch_does(tokens: int, head_dim: int) -> None:
    """The v heads (not rotated) carry the edge values as they are; the k heads get
    rotated random values of every scale. Both must be stored as the bits torch's
    ``.to(torch.float16)`` gives: round to nearest even, overflow to inf, NaN kept."""
    gen = torch.Generator().manual_seed(tokens)
    heads, kv_heads, block_size = 2, 2, 4
    width = (heads + 2 * kv_heads) * head_dim
    qkv = edge_values(tokens * width, gen).view(tokens, width)
    q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
    qkv[:, :k_end] = qkv[:, :k_end].nan_to_num(0.0, 3e4, -3e4)  # keep the rotation finite
    v_edges = edge_values(tokens * kv_heads * head_dim, torch.Generator().manual_seed(1))
    qkv[:, k_end:] = v_edges.view(tokens, -1)
    slots = torch.randperm(tokens + 5, generator=gen)[:tokens]
    num_blocks = -(-(tokens + 5) // block_size)
    pool = torch.zeros(num_blocks, 2, 1, block_size, kv_heads, head_dim, dtype=torch.float16)
    cpu_layer_ops.rotary_store(
        qkv,
        heads,
        kv_heads,
        rope_rows(torch.arange(tokens) * 7, head_dim),
        slots,
        pool[:, 0, 0],
        pool[:, 1, 0],
    )
    expected = torch.zeros_like(pool)
    k_rotated = qkv[:, q_end:k_end].reshape(tokens, kv_heads, head_dim)
    v = qkv[:, k_end:].reshape(tokens, kv_heads, head_dim)
    store_kv_ref(k_rotated, v, expected[:, 0, 0], expected[:, 1, 0], slots)
    assert torch.equal(bits(pool), bits(expected))
    stored_v = pool[:, 1, 0].reshape(-1, kv_heads, head_dim)[slots.long()].reshape(-1)
    assert torch.equal(
        bits(stored_v), bits(v_edges.to(torch.float16))
    )  # edges and NaN payloads as torch has them
    assert torch.isnan(stored_v).sum() == torch.isnan(v_edges).sum()
    assert torch.isinf(stored_v).sum() > torch.isinf(v_edges).sum()  # 65520 and above overflowed


def test_rotary_store_refuses_a_slot_outside_the_cache() -> None:
    qkv, pool = torch.randn(1, 3 * 8), torch.zeros(2, 2, 1, 4, 1, 8)
    with pytest.raises(ValueError, match="outside the KV cache"):
        cpu_layer_ops.rotary_store(
            qkv, 1, 1, rope_rows(torch.tensor([0]), 8), torch.tensor([8]), pool[:, 0, 0], pool[:, 1, 0]
        )


def test_argmax_matches_torch_on_ties_infinities_and_nan() -> None:
    x = torch.randn(6, 49157)
    x[1, 10] = x[1, 20] = 50.0  # a tie: the first index
    x[2] = float("-inf")
    x[3, 4000] = float("inf")
    x[4, 77] = float("nan")  # NaN is the maximum, as in torch
    x[5, -1] = 1e9  # in the scalar tail past the last full vector
    assert torch.equal(cpu_layer_ops.argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(cpu_layer_ops.argmax_rows(x[::2, 3:]), x[::2, 3:].argmax(dim=-1))
