"""Fused add + RMSNorm and in-place rotary embedding against their references."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels.reference import rms_norm_ref, rotary_ref
from tests.kernels.cases import ATOL, DEVICE, max_err, requires_backend

requires_backend()
triton_ops = pytest.importorskip("chatsite_kernels.triton.ops")


def _ulp_tol(dtype: torch.dtype, magnitude: float) -> float:
    # The interpreter's fp32 -> bf16 cast truncates where torch rounds: one ulp on the
    # rounded residual, and one more on the normalised output computed from it.
    return max(ATOL[torch.float32], 2 * magnitude * torch.finfo(dtype).eps)


@pytest.mark.parametrize("hidden", [576, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_fused_add_rms_norm(hidden, dtype, with_residual):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, hidden, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(2, 5, hidden, generator=gen).to(dtype).to(DEVICE) if with_residual else None
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(DEVICE)
    x_before = x.clone()
    out, new_res = triton_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_res = rms_norm_ref(x, weight, 1e-5, residual)
    assert out.shape == x.shape and out.dtype == dtype and new_res.dtype == dtype
    assert torch.equal(x, x_before)  # inputs are not modified
    assert max_err(new_res, ref_res) <= _ulp_tol(dtype, new_res.abs().max().item())
    assert max_err(out, ref_out) <= _ulp_tol(dtype, out.abs().max().item())


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim"),
    [(9, 3, 64), (32, 8, 64), (4, 4, 128)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_in_place_on_fused_qkv_views(q_heads, kv_heads, head_dim, dtype):
    gen = torch.Generator().manual_seed(3)
    max_pos, num_tokens = 4096, 11
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen).to(DEVICE)
    qkv = torch.randn(num_tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(DEVICE)
    q = qkv[:, : q_heads * head_dim].view(num_tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(num_tokens, kv_heads, head_dim)
    v_before = qkv[:, (q_heads + kv_heads) * head_dim :].clone()
    ref_q, ref_k = rotary_ref(q.clone(), k.clone(), positions, cos_sin)

    out_q, out_k = triton_ops.rotary_embedding_(q, k, positions, cos_sin)
    assert out_q is q and out_k is k
    tol = _ulp_tol(dtype, 8.0)  # |rotated| <= |x1| + |x2| of randn values
    assert max_err(q, ref_q) <= tol
    assert max_err(k, ref_k) <= tol
    assert torch.equal(qkv[:, (q_heads + kv_heads) * head_dim :], v_before)  # V untouched
