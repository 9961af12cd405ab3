"""The inner step of the paged attention kernels (``paged_decode``, ``paged_prefill``),
shared by both: load one tile of cached keys or values, and fold one tile of scores into
the running softmax; and the features of ``inference.layers.window_attention`` (logit
soft-cap, attention sinks). Triton inlines these into each kernel."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    cache_ptr, blk, off, head, d, stride_blk, stride_off, stride_head, mask, COMPUTE: tl.constexpr
):
    """``[BLOCK_N, BLOCK_D]`` keys or values of KV head ``head`` at the cache slots
    (block ``blk``, offset ``off``), masked lanes 0, in the ``COMPUTE`` dtype."""
    ptrs = cache_ptr + blk[:, None] * stride_blk + off[:, None] * stride_off + head * stride_head + d[None, :]
    return tl.load(ptrs, mask=mask, other=0.0).to(COMPUTE)


@triton.jit
def online_softmax_step(s, m_i, l_i):
    """Fold a tile of scores ``s`` ``[rows, BLOCK_N]`` (log2 units, masked ones -inf)
    into the running max ``m_i`` and denominator ``l_i``. Returns the tile's weights
    ``p``, the factor ``alpha`` the accumulator is rescaled by, and the new max and
    denominator."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def soft_cap(s, cap):
    """``cap * tanh(s / cap)``, written with exp2 (the interpreter and every backend
    have it): ``tanh(x) = 1 - 2 / (exp(2x) + 1)``, which saturates to +-1 without NaN.
    ``s`` and ``cap`` in the same units (log2 units here: both scaled by log2(e))."""
    e = tl.exp2(s * (2.0 * 1.4426950408889634) / cap)
    return cap * (1.0 - 2.0 / (e + 1.0))


@triton.jit
def fold_sink(acc, m_i, l_i, sink):
    """Join each row's sink logit ``sink`` (log2 units) to its softmax: the accumulator
    and denominator are taken to the larger max, and ``exp2(sink)`` joins the
    denominator (nothing joins the accumulator: a sink has no value)."""
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], l_i * alpha + tl.exp2(sink - m_new)
