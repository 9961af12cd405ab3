"""Triton kernel: RMSNorm fused with the residual add that precedes it."""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import next_pow2


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the activation dtype before normalising, as the unfused
        # (reference) path does, so both paths see the same residual stream.
        s = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, s, mask=mask)
        x = s.to(tl.float32)
    var = tl.sum(x * x, axis=0) / hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same semantics as ``reference.rms_norm_ref(x, weight, eps, residual)``:
    returns ``(normed, new_residual)`` with ``new_residual = x + residual`` (or ``x``
    itself when ``residual`` is None). Inputs are not modified."""
    hidden = x.shape[-1]
    assert weight.shape == (hidden,)
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        res2, res_out, new_residual = x2, x2, x
    else:
        assert residual.shape == x.shape
        res2 = residual.reshape(-1, hidden)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        new_residual = res_out.view(x.shape)
    rows = x2.shape[0]
    if rows > 0:
        _add_rms_norm_kernel[(rows,)](
            x2,
            res2,
            weight,
            out,
            res_out,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            res_out.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=next_pow2(hidden),
            num_warps=min(16, next_pow2(triton.cdiv(hidden, 256))),
        )
    return out.view(x.shape), new_residual
