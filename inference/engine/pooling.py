"""Sentence embeddings from a decoder: mean of the last hidden state, L2-normalised.

As vLLM pools decoder models for ``/v1/embeddings`` (``PoolingType.MEAN`` with
normalisation): one forward of each input, the final norm's output averaged over the
input's tokens. The forward runs over a scratch KV pool of its own, sized to the
batch and dropped afterwards, so embeddings never touch the serving pool, its prefix
cache or its block tables. The engine thread runs it between steps
(``AsyncEngine.embed``), so it never races a generation step.

Inputs are packed into one flat batch per group of at most ``max_batch_tokens`` tokens,
exactly as a prefill step is: each sequence's tokens back to back, a block table of its
own blocks in the scratch pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.layers.attention_context import AttentionContext


def batch_groups(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices of the inputs, grouped in order so each group holds at most
    ``max_batch_tokens`` tokens (an input longer than that is a group alone)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if current and used + n > max_batch_tokens:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        groups.append(current)
    return groups


def _context(lengths: list[int], block_size: int, device: torch.device) -> AttentionContext:
    """A prefill context for sequences laid out one after another in a fresh pool:
    sequence i owns the blocks after sequence i-1's."""
    tables: list[list[int]] = []
    slots: list[int] = []
    next_block = 0
    for n in lengths:
        count = -(-n // block_size)
        table = list(range(next_block, next_block + count))
        tables.append(table)
        slots.extend(next_block * block_size + p for p in range(n))
        next_block += count
    width = max(len(t) for t in tables)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)

    def tensor(data: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=device)

    return AttentionContext(
        slot_mapping=tensor(slots, torch.int64),
        query_start_loc=tensor(starts, torch.int32),
        context_lens=tensor(lengths, torch.int32),
        block_tables=tensor([t + [0] * (width - len(t)) for t in tables], torch.int32),
        max_query_len=max(lengths),
        max_context_len=max(lengths),
    )


@torch.inference_mode()
def forward_mean_pooled(
    model: torch.nn.Module, inputs: list[list[int]], block_size: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """``[len(inputs), hidden]`` fp32: each input's mean last hidden state, L2-normalised,
    from one packed forward over a scratch pool."""
    lengths = [len(ids) for ids in inputs]
    if not inputs or min(lengths) == 0:
        raise ValueError("every input needs at least one token")
    num_blocks = sum(-(-n // block_size) for n in lengths)
    kv_cache = model.kv_spec.allocate(num_blocks, block_size, dtype, device)
    ctx = _context(lengths, block_size, device)
    ids = torch.tensor([t for seq in inputs for t in seq], dtype=torch.int64, device=device)
    positions = torch.tensor([p for n in lengths for p in range(n)], dtype=torch.int64, device=device)
    hidden = model(ids, positions, ctx, kv_cache).float()
    pooled = torch.stack([part.mean(dim=0) for part in torch.split(hidden, lengths)])
    return torch.nn.functional.normalize(pooled, p=2, dim=-1)


def embed_token_ids(
    model: torch.nn.Module,
    inputs: list[list[int]],
    *,
    block_size: int,
    device: torch.device,
    dtype: torch.dtype,
    max_batch_tokens: int,
) -> torch.Tensor:
    """Every input's pooled, normalised embedding (``[N, hidden]`` fp32 on the CPU), in
    groups of at most ``max_batch_tokens`` tokens."""
    out: list[torch.Tensor | None] = [None] * len(inputs)
    for group in batch_groups([len(x) for x in inputs], max_batch_tokens):
        vectors = forward_mean_pooled(model, [inputs[i] for i in group], block_size, device, dtype)
        for i, row in zip(group, vectors.cpu(), strict=True):
            out[i] = row
    return torch.stack([v for v in out if v is not None])
