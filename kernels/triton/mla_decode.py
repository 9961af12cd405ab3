"""Triton kernel: absorbed multi-head latent attention decode (DeepSeek MLA).

One new token per sequence. The queries arrive already absorbed into the latent
space, ``[B, H, r + rope]``; the cache holds one latent per token,
``[num_blocks, block_size, r + rope]`` (normalised ``c_kv`` then rotated ``k_pe``), a
single key/value head that every query head shares. Each program owns one
(sequence, tile of heads): every latent tile is loaded once for all those heads,
scored against the ``c_kv`` and ``k_pe`` parts separately (so neither width needs
to be a power of two), and the softmax-weighted ``c_kv`` is accumulated online.
The result is ``[B, H, r]``; the caller applies ``W_UV``.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import compute_dtype, dot_precision, next_pow2

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # finite start for the running max: masked rows never give NaN


@triton.jit
def _mla_decode_kernel(
    q_ptr,  # [B, H, r + rope]
    cache_ptr,  # [num_blocks, block_size, r + rope], last dim contiguous
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,  # [B, H, r]
    qk_scale,  # softmax scale * log2(e)
    stride_qb,
    stride_qh,
    stride_c_blk,
    stride_c_off,
    stride_bt,
    stride_ob,
    stride_oh,
    num_heads,
    rank,
    rope_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    p = tl.arange(0, BLOCK_P)
    h_mask, r_mask, p_mask = h < num_heads, r < rank, p < rope_dim
    q_row = q_ptr + b * stride_qb + h[:, None] * stride_qh
    q_c = tl.load(q_row + r[None, :], mask=h_mask[:, None] & r_mask[None, :], other=0.0).to(COMPUTE)
    q_p = tl.load(q_row + rank + p[None, :], mask=h_mask[:, None] & p_mask[None, :], other=0.0).to(COMPUTE)

    ctx_len = tl.load(context_lens_ptr + b)
    m_i = tl.full([BLOCK_H], _NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(0, ctx_len, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < ctx_len
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        row = cache_ptr + blk * stride_c_blk + (n % BLOCK_SIZE) * stride_c_off
        k_c = tl.load(row[:, None] + r[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0).to(
            COMPUTE
        )
        k_p = tl.load(row[:, None] + rank + p[None, :], mask=n_mask[:, None] & p_mask[None, :], other=0.0).to(
            COMPUTE
        )
        s = tl.dot(q_c, tl.trans(k_c), input_precision=PRECISION)
        s += tl.dot(q_p, tl.trans(k_p), input_precision=PRECISION)
        s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        prob = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        acc = acc * alpha[:, None] + tl.dot(prob.to(COMPUTE), k_c, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty context gives zeros, not NaN
    o_ptrs = out_ptr + b * stride_ob + h[:, None] * stride_oh + r[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & r_mask[None, :])


def mla_decode_attention(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    rank: int,
    *,
    block_n: int = 32,
) -> torch.Tensor:
    """``softmax(scale * q · latent) · c_kv`` per head: ``query`` ``[B, H, r + rope]``
    (absorbed), ``cache`` ``[num_blocks, block_size, r + rope]`` (a strided view of the
    pool is fine), ``context_lens`` including the new token, whose latent must already
    be stored. Returns ``[B, H, r]`` in ``query``'s dtype; equal to
    ``chatsite_kernels.reference.mla_decode_ref``."""
    batch, heads, dim = query.shape
    _, block_size, cache_dim = cache.shape
    assert cache_dim == dim and 0 < rank < dim, "query and cache widths must be r + rope"
    assert cache.stride(-1) == 1, "the latent must be contiguous"
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty((batch, heads, rank), dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    block_h = max(16, min(64, next_pow2(heads)))  # tl.dot needs M >= 16
    comp = compute_dtype(cache)
    _mla_decode_kernel[(batch, triton.cdiv(heads, block_h))](
        query,
        cache,
        block_tables,
        context_lens,
        out,
        scale * _LOG2E,
        query.stride(0),
        query.stride(1),
        cache.stride(0),
        cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        heads,
        rank,
        dim - rank,
        BLOCK_SIZE=block_size,
        BLOCK_H=block_h,
        BLOCK_N=max(16, block_n),
        BLOCK_R=max(16, next_pow2(rank)),
        BLOCK_P=max(16, next_pow2(dim - rank)),
        COMPUTE=comp,
        PRECISION=dot_precision(comp),
    )
    return out
