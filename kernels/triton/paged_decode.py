"""Triton kernel: paged decode attention (one new token per sequence), split-K.

Each program owns one (sequence, KV head, split). It loads the query heads of
that KV head's group together (GQA: the K/V tile is read once for the whole
group) and walks its slice of the context through the block table. When the
context is split, partial results (unnormalised accumulator, running max and
denominator) are merged by a second kernel with a log-sum-exp rescale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.launch import compute_dtype, dot_precision, next_pow2, num_sms

_LOG2E = 1.4426950408889634
# Running max starts finite so fully masked rows give exp2(-inf - m) = 0, never NaN.
_NEG_BIG = tl.constexpr(-1.0e30)  # a constexpr: jit code may only read constexpr globals


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,  # [B, Hq, D] when not SPLIT, else the fp32 partial accumulators [B, Hq, S, D]
    m_ptr,  # [B, Hq, S] fp32 running max (log2 units); unused when not SPLIT
    l_ptr,  # [B, Hq, S] fp32 softmax denominator
    qk_scale,  # softmax scale * log2(e): the kernel works with exp2
    stride_qb,
    stride_qh,
    stride_kc_blk,
    stride_kc_off,
    stride_kc_h,
    stride_vc_blk,
    stride_vc_off,
    stride_vc_h,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_mb,
    stride_mh,
    group,
    head_dim,
    partition,  # tokens per split, a multiple of BLOCK_N
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,  # a bool, so the split count itself does not force a recompile
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    ctx_len = tl.load(context_lens_ptr + b)
    if SPLIT:
        start = split * partition
        end = tl.minimum(start + partition, ctx_len)
    else:  # one program per (sequence, KV head) takes the whole context, whatever its length
        start = 0
        end = ctx_len

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < group
    d_mask = d < head_dim
    heads = kvh * group + g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(COMPUTE)

    m_i = tl.full([BLOCK_G], _NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)

    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        # Per-token block lookup, so BLOCK_N need not equal the cache block size.
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = n % BLOCK_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            k_cache_ptr
            + blk[:, None] * stride_kc_blk
            + off[:, None] * stride_kc_off
            + kvh * stride_kc_h
            + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(COMPUTE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_cache_ptr
            + blk[:, None] * stride_vc_blk
            + off[:, None] * stride_vc_off
            + kvh * stride_vc_h
            + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(COMPUTE)
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if not SPLIT:
        # An empty context (a padded CUDA-graph slot) gives l == 0: write zeros, not NaN.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
        tl.store(o_ptrs, acc, mask=out_mask)
        ml_off = b * stride_mb + heads * stride_mh + split
        tl.store(m_ptr + ml_off, m_i, mask=g_mask)
        tl.store(l_ptr + ml_off, l_i, mask=g_mask)


@triton.jit
def _merge_kernel(
    acc_ptr,  # [B, Hq, S, D] fp32
    m_ptr,  # [B, Hq, S] fp32
    l_ptr,
    out_ptr,  # [B, Hq, D]
    stride_ab,
    stride_ah,
    stride_as,
    stride_mb,
    stride_mh,
    stride_ob,
    stride_oh,
    num_splits,
    head_dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Log-sum-exp merge: rescale every split to the global max, then normalise once.
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_splits
    d_mask = d < head_dim
    ml_off = b * stride_mb + h * stride_mh + s
    m = tl.load(m_ptr + ml_off, mask=s_mask, other=_NEG_BIG)
    l_part = tl.load(l_ptr + ml_off, mask=s_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - m_max)  # empty splits carry m = -1e30 (or are masked), so w = 0
    denom = tl.sum(l_part * w, axis=0)
    acc = tl.load(
        acc_ptr + b * stride_ab + h * stride_ah + s[:, None] * stride_as + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(batch: int, kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Split the context only when (sequence, KV head) programs alone would leave SMs idle,
    and never into pieces shorter than 256 tokens (the merge is not free)."""
    programs = batch * kv_heads
    want = triton.cdiv(2 * num_sms(device), programs)
    return max(1, min(want, triton.cdiv(max_context_len, 256), 64))


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged context.

    ``query`` ``[B, q_heads, head_dim]``; ``k_cache``/``v_cache``
    ``[num_blocks, block_size, kv_heads, head_dim]`` (strided views allowed);
    ``block_tables`` ``[B, max_blocks]``; ``context_lens`` ``[B]`` includes the new
    token, whose K/V must already be stored. Equal to ``paged_attention_ref`` with
    ``query_start_loc = arange(B + 1)``. Returns a contiguous ``[B, q_heads, head_dim]``.

    ``max_context_len`` (a host int, at least every ``context_lens`` entry) only
    sizes the split-K partition; without it the bound is the block table width, so
    the launch needs no device-to-host sync (CUDA-graph safe). ``num_splits`` forces
    the split count (tests); ``block_n`` is the keys per inner-loop tile.
    """
    batch, q_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    assert q_heads % kv_heads == 0, "query heads must be a multiple of KV heads"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty((batch, q_heads, head_dim), dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    group = q_heads // kv_heads
    bound = block_tables.shape[1] * block_size
    if max_context_len is not None:
        bound = min(bound, max_context_len)
    bound = max(bound, 1)
    block_n = max(16, block_n)
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, bound, query.device)
    # Round each split up to whole BLOCK_N tiles so splits never share a tile.
    partition = triton.cdiv(triton.cdiv(bound, num_splits), block_n) * block_n
    num_splits = triton.cdiv(bound, partition)

    comp = compute_dtype(k_cache)
    block_g = max(16, next_pow2(group))  # tl.dot needs M >= 16
    block_d = next_pow2(head_dim)
    if num_splits == 1:
        acc, m, lsum = out, out, out  # m / l are unused on this path
        acc_strides = (out.stride(0), out.stride(1), 0)
        ml_strides = (0, 0)
    else:
        acc = torch.empty((batch, q_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
        m = torch.empty((batch, q_heads, num_splits), dtype=torch.float32, device=query.device)
        lsum = torch.empty_like(m)
        acc_strides = (acc.stride(0), acc.stride(1), acc.stride(2))
        ml_strides = (m.stride(0), m.stride(1))
    _decode_kernel[(batch, kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        acc,
        m,
        lsum,
        scale * _LOG2E,
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        *acc_strides,
        *ml_strides,
        group,
        head_dim,
        partition,
        BLOCK_SIZE=block_size,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        SPLIT=num_splits > 1,
        COMPUTE=comp,
        PRECISION=dot_precision(comp),
    )
    if num_splits > 1:
        _merge_kernel[(batch, q_heads)](
            acc,
            m,
            lsum,
            out,
            acc.stride(0),
            acc.stride(1),
            acc.stride(2),
            m.stride(0),
            m.stride(1),
            out.stride(0),
            out.stride(1),
            num_splits,
            head_dim,
            BLOCK_S=next_pow2(num_splits),
            BLOCK_D=block_d,
        )
    return out
