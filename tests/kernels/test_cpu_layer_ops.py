"""The C per-layer ops (``chatsite_kernels.cpu.layer_ops``) against their PyTorch definitions:
RMSNorm with a fused residual add, rotary embedding + K/V store, greedy argmax."""

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


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 16), (8, 1, 128)])
def test_rotary_store_matches_rotating_then_storing(heads: int, kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(heads + head_dim)
    tokens, block_size, num_blocks, layers = 6, 4, 5, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.tensor([0, 1, 2, 17, 40, 3])
    slots = torch.tensor([3, 4, -1, 19, 0, 9])  # -1: not stored (CUDA-graph padding)
    cos_sin = rope_rows(positions, head_dim)
    # Strided views of a block-major pool, as the engine passes them.
    pool = torch.full((num_blocks, 2, layers, block_size, kv_heads, head_dim), float("nan"))
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
    torch.testing.assert_close(pool, ref_pool, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.isnan(pool[:, :, 0]).all()  # the other layer is untouched


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
