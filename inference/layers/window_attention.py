"""Paged attention with the features plain causal attention lacks: a sliding window,
learned per-head attention sinks and a logit soft-cap.

The arithmetic is HF's eager attention: scores scaled, soft-capped (``cap * tanh(s /
cap)``), masked causally and to ``kv > q - window``, then a softmax whose denominator
also holds ``exp(sink[h])`` per head (gpt-oss), in fp32. Each sequence reads only the
blocks its window still reaches (a sliding group's table has no blocks before that
point; ``inference.kv.block_manager``).

Dispatch: on CUDA the Triton kernels take the features as parameters; on the CPU in
fp32 the decoding sequences go through the C decode kernel
(``chatsite_kernels.cpu.decode``), and prefill chunks (or other dtypes) through
``feature_attention_torch``, the PyTorch path the kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from chatsite_kernels.cpu import decode as cpu_decode
from inference.layers.attention import _triton_ops, store_kv_cpu
from inference.layers.attention_context import AttentionContext


@dataclass(frozen=True)
class AttentionFeatures:
    """What a layer adds to plain causal attention (all None: nothing)."""

    window: int | None = None  # attend to keys with position > query position - window
    softcap: float | None = None  # scores become softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None  # [Hq] learned logits in each head's softmax denominator

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None


def feature_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: AttentionContext,
    scale: float,
    features: AttentionFeatures,
    *,
    kv_stored: bool = False,
) -> torch.Tensor:
    """Store this step's ``key``/``value`` ``[T, Hkv, D]`` (unless ``kv_stored``), then
    attend each sequence's new queries ``[T, Hq, D]`` over its cached context."""
    ops = _triton_ops() if query.is_cuda else None
    if ops is not None:
        if not kv_stored:
            ops.store_kv(key, value, k_cache, v_cache, ctx.slot_mapping)
        kw = {"window": features.window, "softcap": features.softcap, "sinks": features.sinks}
        if ctx.is_decode_only:
            return ops.paged_decode_attention(
                query, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale, **kw
            )
        return ops.paged_prefill_attention(
            query, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale, **kw
        )
    if not kv_stored:
        store_kv_cpu(key, value, k_cache, v_cache, ctx)
    if ctx.is_decode_only and cpu_decode.supports(query, k_cache, v_cache):
        return cpu_decode.paged_decode_attention_cpu(
            query,
            k_cache,
            v_cache,
            ctx.block_tables,
            ctx.context_lens,
            scale,
            window=features.window,
            softcap=features.softcap,
            sinks=features.sinks,
        )
    return feature_attention_torch(
        query, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale, features
    )


def feature_attention_torch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    features: AttentionFeatures,
) -> torch.Tensor:
    """The PyTorch path (any device, any dtype; K/V already stored): sequence by
    sequence, its window's blocks gathered, attention in fp32. The kernels' oracle."""
    out = torch.empty(
        query.shape[0], query.shape[1], v_cache.shape[-1], dtype=query.dtype, device=query.device
    )
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for i, kv_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        if not q_len:
            continue
        first_pos = kv_len - q_len  # position of the first new query
        lo = 0 if features.window is None else max(0, first_pos - features.window + 1)
        first_block, last_block = lo // block_size, -(-kv_len // block_size)
        blocks = block_tables[i, first_block:last_block].long()
        base = first_block * block_size
        k = k_cache.index_select(0, blocks).flatten(0, 1)[: kv_len - base]
        v = v_cache.index_select(0, blocks).flatten(0, 1)[: kv_len - base]
        out[start:end] = _attend(query[start:end], k, v, first_pos, base, scale, features).to(query.dtype)
    return out


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    first_pos: int,
    base: int,
    scale: float,
    features: AttentionFeatures,
) -> torch.Tensor:
    """``q`` ``[Lq, Hq, D]`` at positions ``first_pos..``; ``k``/``v`` ``[Lk, Hkv, D]`` at
    positions ``base..``. Returns ``[Lq, Hq, Dv]`` fp32."""
    q_len, hq, _ = q.shape
    kv_len, hkv, _ = k.shape
    group = hq // hkv
    qf = q.float().transpose(0, 1).reshape(hkv, group * q_len, -1)  # [Hkv, group*Lq, D]
    kf = k.float().transpose(0, 1)  # [Hkv, Lk, D]
    vf = v.float().transpose(0, 1)
    scores = torch.bmm(qf, kf.transpose(1, 2)).view(hq, q_len, kv_len) * scale
    if features.softcap is not None:
        scores = torch.tanh(scores / features.softcap) * features.softcap
    q_pos = torch.arange(first_pos, first_pos + q_len, device=q.device)[:, None]
    k_pos = torch.arange(base, base + kv_len, device=q.device)[None, :]
    allowed = k_pos <= q_pos
    if features.window is not None:
        allowed &= k_pos > q_pos - features.window
    scores = scores.masked_fill(~allowed, float("-inf"))
    if features.sinks is not None:
        sinks = features.sinks.float().view(hq, 1, 1).expand(hq, q_len, 1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.amax(dim=-1, keepdim=True)
        probs = logits.softmax(dim=-1)[..., :-1]
    else:
        probs = scores.softmax(dim=-1)
    out = torch.bmm(probs.view(hkv, group * q_len, kv_len), vf)  # [Hkv, group*Lq, Dv]
    return out.view(hq, q_len, -1).transpose(0, 1)
