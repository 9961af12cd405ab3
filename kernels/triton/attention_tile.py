"""The inner step of the paged attention kernels (``paged_decode``, ``paged_prefill``),
shared by both: load one tile of cached keys or values, and fold one tile of scores into
the running softmax. Triton inlines these into each kernel."""

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
