"""Triton kernel: write one step's new K/V rows into the paged cache."""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import next_pow2


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_blk,
    stride_kc_off,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_off,
    stride_vc_h,
    num_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token; its heads × head_dim form one [BLOCK_H, BLOCK_D] tile.
    # Heads are padded to a power of two and masked (SmolLM2's 3 × 64 is not one).
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token / already cached: nothing to write
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < head_dim)
    # The last axis is contiguous (checked by the launcher), so d needs no stride.
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    kc = k_cache_ptr + blk * stride_kc_blk + off * stride_kc_off + h * stride_kc_h + d
    vc = v_cache_ptr + blk * stride_vc_blk + off * stride_vc_off + h * stride_vc_h + d
    tl.store(kc, k.to(kc.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(vc.dtype.element_ty), mask=mask)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same semantics as ``reference.store_kv_ref``: ``key``/``value`` ``[T, kv_heads, head_dim]``
    go to ``slot = block * block_size + offset`` of ``k_cache``/``v_cache``
    ``[num_blocks, block_size, kv_heads, head_dim]`` (strided views allowed); slot -1 is skipped."""
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape and slot_mapping.shape[0] == num_tokens
    assert k_cache.shape[2:] == (num_heads, head_dim) and v_cache.shape == k_cache.shape
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    key, value = _last_dim_contiguous(key), _last_dim_contiguous(value)
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        num_heads,
        head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=next_pow2(num_heads),
        BLOCK_D=next_pow2(head_dim),
    )
