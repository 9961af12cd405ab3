"""Plain PyTorch references for the paged KV cache.

These are the engine's CPU path and the test oracle for the Triton kernels.

Cache layout (per layer): ``k_cache`` / ``v_cache`` have shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` and may be strided views
of the engine's pool ``[num_blocks, 2, num_layers, block_size, kv_heads, head_dim]``
(one block's K and V for every layer is one contiguous unit, so it can be
offloaded or copied in one move).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[T, kv_heads, head_dim]`` into the cache at
    ``slot = block * block_size + offset``; slot -1 means "do not store"."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[keep].to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached positions of one sequence: ``[length, kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole cached context.

    ``query`` is ``[T, q_heads, head_dim]``, the new tokens of all sequences packed
    back to back; sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]``.
    ``context_lens[i]`` counts every key of sequence ``i`` including the new ones,
    which must already be stored in the cache. The new tokens are the last
    ``q_len`` positions, so query ``j`` sees keys ``0 .. context_len - q_len + j``.
    Returns ``[T, q_heads, head_dim]`` in ``query``'s dtype.
    """
    out = torch.empty_like(query)
    q_heads = query.shape[1]
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for i, kv_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], kv_len)
        v = gather_kv(v_cache, block_tables[i], kv_len)
        group = q_heads // k.shape[1]
        # [heads, len, dim] for SDPA; GQA by repeating each KV head over its query group.
        q = query[start:end].transpose(0, 1).float()
        k = k.transpose(0, 1).float().repeat_interleave(group, dim=0)
        v = v.transpose(0, 1).float().repeat_interleave(group, dim=0)
        mask = causal_mask(q_len, kv_len, query.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[start:end] = o.transpose(0, 1).to(query.dtype)
    return out


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    """Boolean mask (True = attend) for new tokens that sit at the end of the context."""
    if q_len == 1:
        return None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    return k_pos <= q_pos


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm after an optional residual add. Returns ``(normed, new_residual)``,
    where ``new_residual = x + residual`` (or ``x``), computed in fp32."""
    if residual is not None:
        x = x + residual
    residual_out = x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype), residual_out


def rotary_ref(
    query: torch.Tensor,
    key: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half (Llama/NeoX style) RoPE. ``query`` ``[T, heads, dim]``, ``key``
    ``[T, kv_heads, dim]``, ``cos_sin_cache`` ``[max_pos, dim]`` holding cos in the
    first half of the last axis and sin in the second."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(query), rotate(key)


def mla_decode_ref(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    rank: int,
) -> torch.Tensor:
    """Absorbed MLA decode, one sequence at a time in fp32: ``query`` ``[B, H, r + rope]``,
    latent ``cache`` ``[num_blocks, block_size, r + rope]``. Returns
    ``softmax(scale * q · latent) · latent[:, :r]`` ``[B, H, r]`` in ``query``'s dtype."""
    out = []
    for i in range(query.shape[0]):
        latent = gather_kv(cache, block_tables[i], int(context_lens[i])).float()  # [S, r + rope]
        probs = torch.softmax(query[i].float() @ latent.T * scale, dim=-1)
        out.append(probs @ latent[:, :rank])
    return torch.stack(out).to(query.dtype)


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The batched LoRA shrink (punica's, S-LoRA's): row ``t`` of ``x`` ``[T, K]`` times
    its adapter's ``a[slots[t]]`` ``[R, K]`` -> ``[T, R]`` fp32; rows with slot -1 (the
    base model) are 0. ``a`` ``[S, R, K]`` stacks the resident adapters, zero-padded to
    the largest rank. One product per adapter over all of its rows."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for s in slots.unique().tolist():
        if s >= 0:
            rows = slots == s
            out[rows] = x[rows].float() @ a[s].float().T
    return out


def lora_expand_ref(
    y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> None:
    """The batched LoRA expand: ``out[t] += scales[s] * (b[s] @ y[t])`` for each row ``t``
    whose slot ``s = slots[t]`` is not -1, in place; ``b`` ``[S, N, R]``, ``y`` ``[T, R]``
    (the shrink's), ``out`` ``[T, N]`` (a strided view is fine)."""
    for s in slots.unique().tolist():
        if s >= 0:
            rows = slots == s
            delta = (y[rows].float() @ b[s].float().T) * scales[s].float()
            out[rows] += delta.to(out.dtype)
