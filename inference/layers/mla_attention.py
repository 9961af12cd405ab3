"""Multi-head latent attention over the paged latent pool (DeepSeek V2/V3).

Each layer's cache is ``[num_blocks, block_size, kv_lora_rank + rope_dim]``: per token
the normalised ``c_kv`` and the rotated ``k_pe``, shared by every head. With
``kv_b_proj``'s weight viewed per head as ``W_UK`` ``[H, nope, r]`` (keys) and
``W_UV`` ``[H, v, r]`` (values):

- **Prefill chunks** expand their context through ``kv_b_proj`` into per-head K and V
  (many queries share the expansion) and run ordinary causal attention.
- **Decodes** never expand the cache. The query is absorbed into the latent space,
  ``q_lat = q_nope · W_UK`` ``[H, r]``, and attends over the latent as one shared
  key/value head (MQA): scores ``q_lat · c_kv + q_pe · k_pe``, output
  ``softmax · c_kv`` ``[H, r]``, then ``· W_UV`` gives each head's value output.
  Only ``r + rope_dim`` numbers per cached token are read.

On CUDA the decode goes through the Triton kernel ``chatsite_kernels.triton.mla_decode``; everywhere
else through the PyTorch code below (the same sums). ``MLAttention`` is the layer
around it: the projections that make the latent and the query, and the output one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.layers.attention import _decode_plan, _mixed_split, _triton_ops
from inference.layers.attention_context import AttentionContext
from inference.layers.linear import Linear
from inference.layers.norm import RMSNorm
from inference.layers.rotary import rotate
from inference.model_config import MLAConfig, ModelConfig

# DeepSeek's q_a/kv_a norms use RMSNorm's default epsilon, not config.rms_norm_eps.
_LORA_NORM_EPS = 1e-6


def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    cache: torch.Tensor,
    ctx: AttentionContext,
    w_kv_b: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Store this step's ``latent`` ``[T, r + rope]`` in ``cache`` at ``ctx.slot_mapping``,
    then attend: ``q_nope`` ``[T, H, nope]`` and rotated ``q_pe`` ``[T, H, rope]``;
    ``w_kv_b`` is ``kv_b_proj.weight`` viewed ``[H, nope + v, r]``. Returns ``[T, H, v]``."""
    keep, blocks, offsets = ctx.store_index(cache.shape[1])
    cache[blocks, offsets] = (latent if keep is None else latent[keep]).to(cache.dtype)
    if ctx.is_decode_only:
        return mla_decode(q_nope, q_pe, cache, ctx.block_tables, ctx.context_lens, w_kv_b, scale)
    out = q_nope.new_empty(q_nope.shape[0], w_kv_b.shape[0], w_kv_b.shape[1] - q_nope.shape[-1])
    split = _mixed_split(ctx.block_tables, ctx.query_start_loc, ctx.context_lens)
    if split.decode_tokens is not None:
        rows = split.decode_tokens
        out[rows] = mla_decode(
            q_nope[rows], q_pe[rows], cache, split.decode_tables, split.decode_lens, w_kv_b, scale
        )
    for i, start, end, kv_len in split.prefills:
        if end - start == kv_len:
            # A fresh sequence: its latent is all of its context, rounded as the cache holds it
            # (a no-op unless the pool is float16), so a cached prefix would give the same.
            context = latent[start:end].to(cache.dtype)
        else:
            context = gather_latent(cache, ctx.block_tables[i], kv_len)
        out[start:end] = mla_prefill(q_nope[start:end], q_pe[start:end], context, w_kv_b, scale)
    return out


def gather_latent(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached latents of one sequence ``[length, r + rope]``."""
    num_blocks = -(-length // cache.shape[1])
    rows = cache.flatten(1).index_select(0, block_table[:num_blocks].long())
    return rows.view(-1, cache.shape[-1])[:length]


def mla_prefill(
    q_nope: torch.Tensor, q_pe: torch.Tensor, context: torch.Tensor, w_kv_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """One sequence's new queries ``[q_len, H, *]`` over its whole context's latents
    ``[kv_len, r + rope]`` (the queries are the last ``q_len`` positions), expanded."""
    heads, nope = w_kv_b.shape[0], q_nope.shape[-1]
    q_len, kv_len, rank = q_nope.shape[0], context.shape[0], w_kv_b.shape[-1]
    c_kv, k_pe = context[:, :rank].float(), context[:, rank:].float()
    kv = F.linear(c_kv, w_kv_b.reshape(-1, rank).float()).view(kv_len, heads, -1)
    k = torch.cat((kv[..., :nope], k_pe[:, None].expand(kv_len, heads, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1).float().transpose(0, 1)  # [H, q_len, D]
    k, v = k.transpose(0, 1), kv[..., nope:].transpose(0, 1)
    if q_len == kv_len:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=q_len > 1, scale=scale)
    else:
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return o.transpose(0, 1).to(q_nope.dtype)


def absorb_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_kv_b: torch.Tensor) -> torch.Tensor:
    """``[B, H, r + rope]``: each head's query moved into the latent space (``q_nope · W_UK``)
    next to its rotary part, so one dot product with a cached latent is its score."""
    nope = q_nope.shape[-1]
    q_lat = torch.einsum("bhn,hnr->bhr", q_nope.float(), w_kv_b[:, :nope].float())
    return torch.cat((q_lat, q_pe.float()), dim=-1)


def mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    w_kv_b: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence, absorbed: reads only the latent pool. ``[B, H, v]``."""
    nope, rank = q_nope.shape[-1], w_kv_b.shape[-1]
    q = absorb_query(q_nope, q_pe, w_kv_b)
    ops = _triton_ops() if q.is_cuda else None
    if ops is not None:
        o_lat = ops.mla_decode_attention(q.to(cache.dtype), cache, block_tables, context_lens, scale, rank)
    else:
        o_lat = mla_decode_latent_torch(q, cache, block_tables, context_lens, scale, rank)
    out = torch.einsum("bhr,hvr->bhv", o_lat.float(), w_kv_b[:, nope:].float())
    return out.to(q_nope.dtype)


def mla_decode_latent_torch(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    rank: int,
) -> torch.Tensor:
    """``softmax(q · latent) · c_kv`` ``[B, H, r]`` fp32 for absorbed queries ``[B, H, r + rope]``.

    The latent is one key head shared by all query heads, so the heads become SDPA's
    query-length axis; sequences go in length-sorted chunks (``attention._decode_plan``),
    each one gather of whole blocks and one masked SDPA call."""
    batch, heads, dim = q.shape
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    out = q.new_empty(batch, heads, rank)
    rows = cache.reshape(num_blocks, -1)  # a block's latents are contiguous in the pool
    for chunk in _decode_plan(block_tables, context_lens, block_size, dim):
        b = len(chunk.rows)
        lat = rows.index_select(0, chunk.blocks).view(-1, dim).index_fill_(0, chunk.tail, 0)
        lat = lat.view(b, 1, -1, dim)[:, :, : chunk.max_len].float()
        o = F.scaled_dot_product_attention(
            q[chunk.rows].view(b, 1, heads, dim), lat, lat[..., :rank], attn_mask=chunk.mask, scale=scale
        )
        out[chunk.rows] = o.view(b, heads, rank)
    return out


class MLAttention(nn.Module):
    """DeepSeek's attention layer: low-rank query (``q_a`` -> norm -> ``q_b``, or one
    ``q_proj``), the joint latent ``kv_a_proj_with_mqa`` -> (``c_kv``, ``k_pe``), rotary
    on the rope parts, ``mla_attention`` over the latent pool, output projection."""

    def __init__(self, config: ModelConfig, mla: MLAConfig, layer_idx: int) -> None:
        super().__init__()
        self.mla = mla
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = self.num_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, q_out, bias=False)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, _LORA_NORM_EPS)
            self.q_b_proj = Linear(mla.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, _LORA_NORM_EPS)
        self.kv_b_proj = Linear(
            mla.kv_lora_rank, self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False
        )
        self.o_proj = Linear(self.num_heads * mla.v_head_dim, hidden, bias=bias)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        mla, tokens, heads = self.mla, hidden.shape[0], self.num_heads
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(tokens, heads, -1).split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(hidden).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        q_pe = rotate(q_pe, cos, sin, mla.rope_interleave)
        k_pe = rotate(k_pe[:, None], cos, sin, mla.rope_interleave)[:, 0]
        latent = torch.cat((self.kv_a_layernorm(c_kv.contiguous()), k_pe), dim=-1)
        w_kv_b = self.kv_b_proj.weight.view(heads, -1, mla.kv_lora_rank)
        out = mla_attention(
            q_nope, q_pe, latent, kv_cache[:, 0, self.layer_idx], ctx, w_kv_b, mla.softmax_scale
        )
        return self.o_proj(out.reshape(tokens, heads * mla.v_head_dim))

    def prepare_packed(self) -> None:
        for name in ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
            proj = getattr(self, name, None)
            if proj is not None:
                proj.prepare_packed()
