"""Triton kernel: paged decode attention (one new token per sequence), split-K.

Each program owns one (sequence, KV head, split). It loads the query heads of
that KV head's group together (GQA: the K/V tile is read once for the whole
group) and walks its slice of the context through the block table. When the
context is split, partial results (unnormalised accumulator, running max and
denominator) are merged by a second kernel with a log-sum-exp rescale.

The features of ``inference.layers.window_attention`` are compile-time switches: a
sliding window (the loop starts at the window's first position, so earlier blocks are
never read), a logit soft-cap and per-head sinks (folded in at the end, or by the
merge when the context is split).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.attention_tile import fold_sink, load_kv_tile, online_softmax_step, soft_cap
from chatsite_kernels.triton.launch import compute_dtype, dot_precision, next_pow2, num_sms

_LOG2E = 1.4426950408889634
# Running max starts finite so fully masked rows give exp2(-inf - m) = 0, never NaN.
_NEG_BIG = tl.constexpr(-1.0e30)  # a constexpr: jit code may only read constexpr globals


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr,  # [B, Hq, D] when not SPLIT, else the fp32 partial accumulators [B, Hq, S, D]
    m_ptr,  # [B, Hq, S] fp32 running max (log2 units); unused when not SPLIT
    l_ptr,  # [B, Hq, S] fp32 softmax denominator
    qk_scale,  # softmax scale * log2(e): the kernel works with exp2
    window,  # attend to the last `window` positions (when HAS_WINDOW)
    cap,  # soft-cap * log2(e) (when HAS_SOFTCAP)
    sinks_ptr,  # [Hq] sink logits (when HAS_SINKS)
    stride_qb, stride_qh,
    stride_kc_blk, stride_kc_off, stride_kc_h,
    stride_vc_blk, stride_vc_off, stride_vc_h,
    stride_bt,
    stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh,
    group, head_dim,
    partition,  # tokens per split, a multiple of BLOCK_N
    BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,  # a bool, so the split count itself does not force a recompile
    COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
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
    if HAS_WINDOW:
        start = tl.maximum(start, ctx_len - window)

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
        k = load_kv_tile(
            k_cache_ptr, blk, off, kvh, d, stride_kc_blk, stride_kc_off, stride_kc_h, kv_mask, COMPUTE
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        if HAS_SOFTCAP:
            s = soft_cap(s, cap)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i)
        v = load_kv_tile(
            v_cache_ptr, blk, off, kvh, d, stride_vc_blk, stride_vc_off, stride_vc_h, kv_mask, COMPUTE
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)

    out_mask = g_mask[:, None] & d_mask[None, :]
    if not SPLIT:
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=g_mask, other=0.0).to(tl.float32) * 1.4426950408889634
            acc, l_i = fold_sink(acc, m_i, l_i, sink)
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
    sinks_ptr,  # [Hq] sink logits (when HAS_SINKS)
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
    HAS_SINKS: tl.constexpr,
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
    if HAS_SINKS:  # the sink joins the denominator at the common max
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    w = tl.exp2(m - m_max)  # empty splits carry m = -1e30 (or are masked), so w = 0
    denom = tl.sum(l_part * w, axis=0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m_max)
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
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
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

    ``window``, ``softcap``, ``sinks`` (``[q_heads]``, on the query's device): as
    ``inference.layers.window_attention.feature_attention_torch``. None of them
    reads the host, so a launch with them is CUDA-graph safe too.
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
    block_n = max(16, block_n)
    partition, num_splits = _split_context(max(bound, 1), num_splits, block_n, batch, kv_heads, query.device)

    comp = compute_dtype(k_cache)
    block_d = next_pow2(head_dim)
    parts = _Partials.for_splits(out, num_splits)
    sinks_arg = sinks if sinks is not None else context_lens  # never read without HAS_SINKS
    _decode_kernel[(batch, kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, context_lens, parts.acc, parts.m, parts.lsum, scale * _LOG2E,
        window or 0, (softcap or 1.0) * _LOG2E, sinks_arg,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *parts.acc_strides,
        *parts.ml_strides,
        group, head_dim, partition,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(16, next_pow2(group)),  # tl.dot needs M >= 16
        BLOCK_N=block_n, BLOCK_D=block_d, SPLIT=num_splits > 1,
        COMPUTE=comp, PRECISION=dot_precision(comp),
        HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
    )  # fmt: skip
    if num_splits > 1:
        _merge_splits(parts, out, num_splits, head_dim, block_d, sinks)
    return out


def _split_context(
    bound: int, num_splits: int | None, block_n: int, batch: int, kv_heads: int, device: torch.device
) -> tuple[int, int]:
    """``(tokens per split, splits)`` for contexts of at most ``bound`` tokens: each
    split whole ``block_n`` tiles, so splits never share a tile; ``num_splits`` None
    lets ``choose_num_splits`` pick."""
    if num_splits is None:
        num_splits = choose_num_splits(batch, kv_heads, bound, device)
    partition = triton.cdiv(triton.cdiv(bound, num_splits), block_n) * block_n
    return partition, triton.cdiv(bound, partition)


@dataclass
class _Partials:
    """Where the decode kernel writes: with one split straight into ``out`` (``m`` and
    ``lsum`` unused), else each split's fp32 accumulator, running max and denominator
    for ``_merge_kernel``."""

    acc: torch.Tensor
    m: torch.Tensor
    lsum: torch.Tensor
    acc_strides: tuple[int, int, int]
    ml_strides: tuple[int, int]

    @classmethod
    def for_splits(cls, out: torch.Tensor, num_splits: int) -> _Partials:
        if num_splits == 1:
            return cls(out, out, out, (out.stride(0), out.stride(1), 0), (0, 0))
        batch, q_heads, head_dim = out.shape
        acc = torch.empty((batch, q_heads, num_splits, head_dim), dtype=torch.float32, device=out.device)
        m = torch.empty((batch, q_heads, num_splits), dtype=torch.float32, device=out.device)
        return cls(
            acc,
            m,
            torch.empty_like(m),
            (acc.stride(0), acc.stride(1), acc.stride(2)),
            (m.stride(0), m.stride(1)),
        )


def _merge_splits(
    parts: _Partials,
    out: torch.Tensor,
    num_splits: int,
    head_dim: int,
    block_d: int,
    sinks: torch.Tensor | None,
) -> None:
    acc, m = parts.acc, parts.m
    _merge_kernel[(out.shape[0], out.shape[1])](
        acc, m, parts.lsum, out, sinks if sinks is not None else m,
        acc.stride(0), acc.stride(1), acc.stride(2),
        m.stride(0), m.stride(1),
        out.stride(0), out.stride(1),
        num_splits, head_dim,
        BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d, HAS_SINKS=sinks is not None,
    )  # fmt: skip
