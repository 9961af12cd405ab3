"""Triton kernel: ``x @ W^T`` over block-quantized weights in the panel layout of
``chatsite_kernels.cpu.quant`` (GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q6_K repacked), de-quantized in
registers and multiplied in fp32 (IEEE, no TF32), so the weights are the exact values
transformers' GGUF loader produces.

One program computes BLOCK_M rows by one panel of 16 outputs, a group of G inputs at
a time: it loads the group's 16 scales (and offsets), de-quantizes the G x 16 block
and multiplies the rows' G inputs by it. The panel data is passed three times, viewed
as fp32 (scales, offsets), uint8 (4-bit quants) and int8 (8-bit quants).
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.cpu.quant import FORMATS, GROUP, GROUP_BYTES, PackedQuant


@triton.jit
def _quant_matmul_kernel(
    x_ptr,
    wf_ptr,
    wu_ptr,
    wi_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    FMT: tl.constexpr,
    G: tl.constexpr,
    GROUP_BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    panel = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, 16)
    kk = tl.arange(0, G)
    groups = K // G
    acc = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
    for g in range(0, groups):
        base = (panel * groups + g) * GROUP_BYTES  # bytes
        scale = tl.load(wf_ptr + base // 4 + cols)
        if FMT == 2:  # 4-bit: byte j of a k step holds output j (low) and j + 8 (high)
            offset = tl.load(wf_ptr + base // 4 + 16 + cols)
            byte = tl.load(wu_ptr + base + 128 + kk[:, None] * 8 + (cols[None, :] % 8)).to(tl.int32)
            q = tl.where(cols[None, :] < 8, byte & 15, byte >> 4).to(tl.float32)
            w = q * scale[None, :] + offset[None, :]
        else:
            q = tl.load(wi_ptr + base + 64 + kk[:, None] * 16 + cols[None, :]).to(tl.float32)
            w = q * scale[None, :]
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + g * G + kk[None, :], mask=rows[:, None] < M, other=0.0
        ).to(tl.float32)
        acc += tl.dot(x, w, input_precision="ieee")
    out_cols = panel * 16 + cols
    mask = (rows[:, None] < M) & (out_cols[None, :] < N)
    tl.store(out_ptr + rows[:, None] * stride_om + out_cols[None, :], acc, mask=mask)


def quant_matmul(x: torch.Tensor, packed: PackedQuant, block_m: int = 16) -> torch.Tensor:
    """``F.linear(x, packed.dequantize())`` in fp32, ``x`` ``[..., K]`` on the
    device holding ``packed.data``."""
    k, n = packed.in_features, packed.out_features
    if x.shape[-1] != k or x.device != packed.data.device:
        raise ValueError(
            f"x: expected [..., {k}] on {packed.data.device}, got {tuple(x.shape)} on {x.device}"
        )
    if packed.fmt not in FORMATS or packed.data.dtype != torch.uint8 or not packed.data.is_contiguous():
        raise ValueError("packed: expected contiguous uint8 panels from chatsite_kernels.cpu.quant.pack()")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        data = packed.data
        grid = (triton.cdiv(rows.shape[0], block_m), triton.cdiv(n, 16))
        _quant_matmul_kernel[grid](
            rows,
            data.view(torch.float32),
            data,
            data.view(torch.int8),
            out,
            rows.shape[0],
            n,
            k,
            rows.stride(0),
            out.stride(0),
            FMT=FORMATS[packed.fmt],
            G=GROUP[packed.fmt],
            GROUP_BYTES=GROUP_BYTES[packed.fmt],
            BLOCK_M=block_m,
        )
    return out.view(*x.shape[:-1], n)
