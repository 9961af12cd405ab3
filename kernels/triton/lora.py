"""Triton kernels: the batched LoRA shrink and expand (punica's BGMV), for batches whose
rows each run their own adapter (or none) over base weights that ran once for all.

One kernel serves both: row ``t`` times the ``[N, K]`` matrix ``w[slots[t]]``, written
(the shrink: ``w`` = A ``[S, R, K]``, out ``[T, R]``, 0 for slot -1) or added scaled (the
expand: ``w`` = B ``[S, N, R]``, ``out[t] += scales[s] * ...``, rows of slot -1 left
alone). A program computes ``BLOCK_N`` outputs of one row; rows of one adapter read the
same weights, which stay in cache across them. Same semantics as
``chatsite_kernels.reference.lora_shrink_ref`` / ``lora_expand_ref``; fp32 accumulation.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import next_pow2


@triton.jit
def _bgmv_kernel(
    x_ptr,
    w_ptr,
    slots_ptr,
    scales_ptr,
    out_ptr,
    N,
    K,
    stride_xt,
    stride_ws,
    stride_wn,
    stride_ot,
    ADD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    slot = tl.load(slots_ptr + t)
    valid = (cols * 0 + slot) >= 0  # per column: the interpreter takes only vector masks
    s = tl.maximum(slot, 0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        xk = tl.load(x_ptr + t * stride_xt + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + s * stride_ws + cols[:, None] * stride_wn + (k0 + ks)[None, :],
            mask=(col_ok & valid)[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * xk[None, :], axis=1)
    out_at = out_ptr + t * stride_ot + cols
    if ADD:
        scale = tl.load(scales_ptr + s).to(tl.float32)
        old = tl.load(out_at, mask=col_ok & valid, other=0.0).to(tl.float32)
        tl.store(out_at, (old + scale * acc).to(out_ptr.dtype.element_ty), mask=col_ok & valid)
    else:
        tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def _launch(x, w, slots, scales, out, add: bool) -> None:
    t = x.shape[0]
    n, k = w.shape[1], w.shape[2]
    if t == 0:
        return
    block_n = min(64, next_pow2(n))
    block_k = min(128, next_pow2(k))
    grid = (t, triton.cdiv(n, block_n))
    _bgmv_kernel[grid](
        x, w, slots, scales, out, n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        ADD=add, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, K]``, ``a`` ``[S, R, K]`` -> ``[T, R]`` fp32."""
    x = x.contiguous()
    a = a.contiguous()
    out = torch.empty(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    _launch(x, a, slots.to(torch.int32).contiguous(), out, out, add=False)
    return out


def lora_expand(
    y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[t] += scales[s] * b[s] @ y[t]`` in place; ``out`` may be a column slice."""
    assert out.stride(-1) == 1, "out needs a unit inner stride"
    _launch(
        y.contiguous(),
        b.contiguous(),
        slots.to(torch.int32).contiguous(),
        scales.float().contiguous(),
        out,
        add=True,
    )
