"""Triton kernel: rotate-half (Llama/NeoX) rotary embedding applied in place."""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import next_pow2


@triton.jit
def _rotate_tile(ptr, t, stride_t, stride_h, num_heads, cos, sin, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, HALF)[None, :]
    mask = h < num_heads  # heads padded to a power of two (3 KV heads -> 4)
    base = ptr + t * stride_t + h * stride_h
    x1 = tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + i, mask=mask, other=0.0).to(tl.float32)
    tl.store(base + i, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(base + HALF + i, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    q_heads,
    k_heads,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
):
    # One program per token: its position's cos/sin row is loaded once and used
    # for every query and key head.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF)[None, :]
    cos = tl.load(cache_ptr + pos * stride_cache + i).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + i).to(tl.float32)
    _rotate_tile(q_ptr, t, stride_qt, stride_qh, q_heads, cos, sin, BLOCK_HQ, HALF)
    _rotate_tile(k_ptr, t, stride_kt, stride_kh, k_heads, cos, sin, BLOCK_HK, HALF)


def rotary_embedding_(
    query: torch.Tensor,
    key: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-place version of ``reference.rotary_ref``: ``query`` ``[T, heads, dim]`` and
    ``key`` ``[T, kv_heads, dim]`` (strided views allowed, e.g. slices of a fused QKV
    projection, as long as ``dim`` is contiguous) are rotated by the rows
    ``cos_sin_cache[positions]`` (cos | sin halves). Returns ``(query, key)``."""
    num_tokens, q_heads, head_dim = query.shape
    assert key.shape[0] == num_tokens and key.shape[2] == head_dim
    assert cos_sin_cache.shape[-1] == head_dim, "partial rotary is not supported"
    assert head_dim % 2 == 0 and (head_dim // 2) & (head_dim // 2 - 1) == 0, (
        "head_dim/2 must be a power of two"
    )
    assert query.stride(-1) == 1 and key.stride(-1) == 1, "in-place rotary needs a contiguous head_dim"
    assert cos_sin_cache.stride(-1) == 1
    if num_tokens == 0:
        return query, key
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        positions,
        cos_sin_cache,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos_sin_cache.stride(0),
        q_heads,
        key.shape[1],
        HALF=head_dim // 2,
        BLOCK_HQ=next_pow2(q_heads),
        BLOCK_HK=next_pow2(key.shape[1]),
        num_warps=4 if triton.cdiv(q_heads * head_dim, 1024) > 1 else 2,
    )
    return query, key
