"""Triton kernel: paged prefill / extend attention over ragged batches.

Sequence ``i`` brings ``q_len`` new tokens that are the last ``q_len`` of its
``context_len`` cached positions (their K/V already stored), so query ``j``
attends keys ``0 .. context_len - q_len + j``. This covers plain prefill
(no prefix), chunked prefill and prefix-cache hits (a cached prefix), and
decode rows mixed into the same batch (``q_len == 1``).

Work is cut into query tiles of ``BLOCK_Q`` tokens of one sequence. The grid is
sized from host-known shapes only (``T // BLOCK_Q + B`` tiles), and each program
finds its sequence by binary search over ``query_start_loc``, so launching never
needs a device-to-host sync. Each tile packs ``BLOCK_Q`` tokens × the query heads
of one KV head into its rows, so a K/V tile is loaded once per GQA group.

A sliding window (keys after ``position - window``; a tile's loop starts at its first
row's window, so earlier blocks are never read), a logit soft-cap and per-head sinks
are compile-time switches, as in ``paged_decode``.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.attention_tile import fold_sink, load_kv_tile, online_softmax_step, soft_cap
from chatsite_kernels.triton.launch import compute_dtype, dot_precision, next_pow2

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # a constexpr: jit code may only read constexpr globals


@triton.jit
def _find_seq(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    # Sequence i owns tiles starting at query_start_loc[i] // BLOCK_Q + i (an upper
    # bound of the tiles before it), so the starts are strictly increasing and the
    # owner of `tile` is the last i whose start is <= tile.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if start <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, context_lens_ptr, out_ptr,
    qk_scale,  # softmax scale * log2(e)
    window,  # attend to keys after position - window (when HAS_WINDOW)
    cap,  # soft-cap * log2(e) (when HAS_SOFTCAP)
    sinks_ptr,  # [Hq] sink logits (when HAS_SINKS)
    stride_qt, stride_qh,
    stride_kc_blk, stride_kc_off, stride_kc_h,
    stride_vc_blk, stride_vc_off, stride_vc_h,
    stride_bt,
    stride_ot, stride_oh,
    num_seqs, group, head_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local = tile - (q_start // BLOCK_Q + seq)
    if local * BLOCK_Q >= q_len:  # spare tile of the upper-bound grid
        return
    ctx_len = tl.load(context_lens_ptr + seq)
    prefix = ctx_len - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_G
    r = tl.arange(0, BLOCK_M)
    tok = local * BLOCK_Q + r // BLOCK_G  # token index within the sequence's new tokens
    g = r % BLOCK_G
    row_mask = (tok < q_len) & (g < group)
    heads = kvh * group + g
    pos = prefix + tok  # absolute position of each row's query token
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    qo_mask = row_mask[:, None] & d_mask[None, :]
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=qo_mask,
        other=0.0,
    ).to(COMPUTE)

    m_i = tl.full([BLOCK_M], _NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # The last token of this tile sees the most keys; nothing beyond it is needed.
    kv_end = prefix + tl.minimum((local + 1) * BLOCK_Q, q_len)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_start = 0
    if HAS_WINDOW:  # the tile's first token sees the earliest keys
        kv_start = tl.maximum(prefix + local * BLOCK_Q - window + 1, 0)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = n % BLOCK_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = load_kv_tile(
            k_cache_ptr, blk, off, kvh, d, stride_kc_blk, stride_kc_off, stride_kc_h, kv_mask, COMPUTE
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if HAS_SOFTCAP:
            s = soft_cap(s, cap)
        causal = (n[None, :] <= pos[:, None]) & n_mask[None, :]
        if HAS_WINDOW:
            causal &= n[None, :] > pos[:, None] - window
        s = tl.where(causal, s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i)
        v = load_kv_tile(
            v_cache_ptr, blk, off, kvh, d, stride_vc_blk, stride_vc_off, stride_vc_h, kv_mask, COMPUTE
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)

    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=row_mask, other=0.0).to(tl.float32) * 1.4426950408889634
        acc, l_i = fold_sink(acc, m_i, l_i, sink)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=qo_mask)


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int = 64,
    block_n: int = 64,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same semantics as ``reference.paged_attention_ref``.

    ``query`` ``[T, q_heads, head_dim]`` packs every sequence's new tokens;
    sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]`` and has
    ``context_lens[i]`` keys in total (new ones included, already stored).
    Returns a contiguous ``[T, q_heads, head_dim]``; rows past
    ``query_start_loc[-1]`` are left uninitialised, as in the reference.
    ``block_m`` is the rows per tile (tokens × heads of one GQA group).
    ``window``, ``softcap``, ``sinks`` (``[q_heads]``): as
    ``inference.layers.window_attention.feature_attention_torch``.
    """
    num_tokens, q_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    assert q_heads % kv_heads == 0, "query heads must be a multiple of KV heads"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty((num_tokens, q_heads, head_dim), dtype=query.dtype, device=query.device)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = q_heads // kv_heads
    block_g = next_pow2(group)
    block_q = max(1, block_m // block_g)
    if block_q * block_g < 16:  # tl.dot needs M >= 16
        block_q = 16 // block_g
    comp = compute_dtype(k_cache)
    if comp == tl.float32 and head_dim > 64:
        # fp32 tiles are twice as big: keep shared memory under the ~100 KB of consumer GPUs.
        block_n = min(block_n, 32)
    grid = (num_tokens // block_q + num_seqs, kv_heads)
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        context_lens,
        out,
        scale * _LOG2E,
        window or 0,
        (softcap or 1.0) * _LOG2E,
        sinks if sinks is not None else context_lens,  # never read without HAS_SINKS
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_seqs,
        group,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_G=block_g,
        BLOCK_N=max(16, block_n),
        BLOCK_D=next_pow2(head_dim),
        COMPUTE=comp,
        PRECISION=dot_precision(comp),
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
    )
    return out
