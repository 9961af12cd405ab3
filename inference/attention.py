"""Attention over the paged KV cache, dispatched by device.

CPU: ``kernels.reference`` stores K/V; attention uses the batched/looped
PyTorch code below, which computes exactly what ``paged_attention_ref`` does
(that function stays the oracle the tests compare against) but avoids a
Python loop per sequence in decode steps.

CUDA: ``kernels.triton_ops`` (imported lazily so CPU installs never need triton).
"""

from __future__ import annotations

import logging
from functools import cache
from types import ModuleType

import torch
import torch.nn.functional as F

from inference.attention_context import AttentionContext
from kernels.reference import store_kv_ref

logger = logging.getLogger(__name__)

# Upper bound on gathered K (+V) elements per decode chunk, so a big batch of long
# sequences does not materialise hundreds of MB at once on CPU.
_DECODE_GATHER_BUDGET = 16 * 1024 * 1024
# Sequences per decode chunk: sorted by length, small chunks pad little; measured
# fastest around 16 for SmolLM2's shape on CPU.
_DECODE_CHUNK = 16


@cache
def _triton_ops() -> ModuleType | None:
    try:
        from kernels import triton_ops  # noqa: PLC0415 - lazy: needs triton and a GPU
    except ImportError as exc:  # pragma: no cover - depends on the machine
        logger.warning("kernels.triton_ops unavailable (%s); using the PyTorch attention path", exc)
        return None
    return triton_ops


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: AttentionContext,
    scale: float,
) -> torch.Tensor:
    """Store this step's ``key``/``value`` ``[T, Hkv, D]`` at ``ctx.slot_mapping``, then
    attend each sequence's new queries ``[T, Hq, D]`` over its cached context."""
    ops = _triton_ops() if query.is_cuda else None
    if ops is not None:
        ops.store_kv(key, value, k_cache, v_cache, ctx.slot_mapping)
        if ctx.is_decode_only:
            return ops.paged_decode_attention(
                query, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale
            )
        return ops.paged_prefill_attention(
            query, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
        )
    store_kv_ref(key, value, k_cache, v_cache, ctx.slot_mapping)
    if ctx.is_decode_only:
        return decode_attention_torch(query, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale)
    return prefill_attention_torch(
        query, key, value, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
    )


def decode_attention_torch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence: ``query`` ``[B, Hq, D]``. Sequences are sorted by
    length and cut into chunks of similar length (little padding); each chunk is one
    gather of whole blocks plus one masked SDPA call.

    - Gather: ``index_select`` over blocks viewed as rows ``[num_blocks, bs*Hkv*D]``
      copies each block's contiguous slab at once; advanced indexing with a 2-D
      block table is an element-wise gather and ~10x slower on CPU.
    - GQA without copies: the query heads of one KV head become SDPA's "query length"
      axis (``[B, Hkv, group, D]``), which is valid because every one of them attends
      to the same keys with the same mask.
    """
    num_seqs, q_heads, head_dim = query.shape
    num_cache_blocks, block_size, kv_heads = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    out = torch.empty_like(query)
    lens = context_lens.tolist()
    order = sorted(range(num_seqs), key=lens.__getitem__)
    k_rows = k_cache.reshape(num_cache_blocks, -1)  # a view: a block's slab is contiguous
    v_rows = v_cache.reshape(num_cache_blocks, -1)
    per_token = 2 * kv_heads * head_dim
    start = 0
    while start < num_seqs:
        # Grow the chunk (lengths ascend) up to _DECODE_CHUNK sequences and the gather budget.
        end = start + 1
        while (
            end < num_seqs
            and end - start < _DECODE_CHUNK
            and (end + 1 - start) * lens[order[end]] * per_token <= _DECODE_GATHER_BUDGET
        ):
            end += 1
        rows = order[start:end]
        idx = torch.tensor(rows, device=query.device)
        b = len(rows)
        max_len = lens[rows[-1]]
        num_blocks = -(-max_len // block_size)
        blocks = block_tables[idx, :num_blocks].reshape(-1).long()
        shape = (b, num_blocks * block_size, kv_heads, head_dim)
        k = k_rows.index_select(0, blocks).view(shape)[:, :max_len]
        v = v_rows.index_select(0, blocks).view(shape)[:, :max_len]
        chunk_lens = context_lens[idx].long()
        valid = torch.arange(max_len, device=query.device)[None, :] < chunk_lens[:, None]
        # Zero the padding (these are private copies): stale or uninitialised cache
        # slots may hold inf/NaN, and masked-out NaN still poisons SDPA's matmuls.
        if query.is_cuda:
            k.masked_fill_(~valid[:, :, None, None], 0)
            v.masked_fill_(~valid[:, :, None, None], 0)
        else:  # only the short tails: cheaper than a pass over the whole chunk
            for j, i in enumerate(rows):
                k[j, lens[i] :] = 0
                v[j, lens[i] :] = 0
        q = query[idx].reshape(b, kv_heads, group, head_dim).float()
        mask = valid[:, None, None, :]
        o = F.scaled_dot_product_attention(
            q, k.transpose(1, 2).float(), v.transpose(1, 2).float(), attn_mask=mask, scale=scale
        )
        out[idx] = o.reshape(b, q_heads, head_dim).to(query.dtype)
        start = end
    return out


def prefill_attention_torch(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Mixed step: loop over sequences (few of them, with many tokens each).

    A sequence with no cached prefix attends over its fresh ``key``/``value`` directly
    (same values that were just stored), skipping the gather from the cache."""
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    block_size = k_cache.shape[1]
    for i, kv_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        if q_len == kv_len:
            k, v = key[start:end], value[start:end]
        else:
            num_blocks = -(-kv_len // block_size)
            blocks = block_tables[i, :num_blocks].long()
            k = k_cache[blocks].flatten(0, 1)[:kv_len]
            v = v_cache[blocks].flatten(0, 1)[:kv_len]
        q = query[start:end].transpose(0, 1).float()  # [Hq, q_len, D]
        k = k.transpose(0, 1).float()  # [Hkv, kv_len, D]
        v = v.transpose(0, 1).float()
        if q_len == 1:
            mask = None
        else:
            q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
            mask = torch.arange(kv_len, device=query.device)[None, :] <= q_pos
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = o.transpose(0, 1).to(query.dtype)
    return out
