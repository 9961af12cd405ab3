"""Optional CPU decode attention fused by TorchInductor.

Eager decode attention (``attention.decode_attention_torch``) first gathers each
sequence's blocks into a padded copy, then SDPA reads the copy: every K/V byte
crosses memory three times, and at batch 64 that is ~40% of a SmolLM2 decode step.
Written below as indexing + multiply + sum, Inductor fuses the gather into the
reductions and emits one C++ loop nest that reads K/V once, in place in the pool
(padded table entries all point at block 0, which stays in cache).

It needs a C++ compiler at run time and compiles in seconds (Inductor caches the
result on disk). ``install()`` compiles it, checks it against the eager path on the
engine's own pool, and returns it for the model runner to use (through
``attention.cpu_decode_attention``); any failure logs a warning and returns None,
leaving the eager path in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from inference import attention

logger = logging.getLogger(__name__)

_compiled: Callable[..., torch.Tensor] | None = None  # one per process; Dynamo guards per shape
_validated: set[tuple[object, ...]] = set()


def fused_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``attention.decode_attention_torch``; only sensible compiled
    (eager, it would materialise ``[B, L, Hkv, group, D]`` products)."""
    b, q_heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    length = block_tables.shape[1] * block_size
    blocks = block_tables.long()
    k = k_cache[blocks].reshape(b, length, kv_heads, 1, head_dim).float()
    v = v_cache[blocks].reshape(b, length, kv_heads, 1, head_dim).float()
    q = query.reshape(b, 1, kv_heads, group, head_dim).float()
    valid = torch.arange(length, device=query.device)[None, :] < context_lens[:, None]
    valid = valid[:, :, None, None]  # [b, L, 1, 1]
    # Stale slots past a sequence's length may hold anything (even NaN): where(), not
    # a multiplicative mask, keeps them out of both reductions.
    scores = torch.where(valid, (q * k).sum(-1) * scale, float("-inf"))  # [b, L, Hkv, group]
    probs = torch.softmax(scores, dim=1)
    out = (probs[..., None] * torch.where(valid[..., None], v, 0.0)).sum(1)  # [b, Hkv, group, D]
    return out.reshape(b, q_heads, head_dim).to(query.dtype)


def _at_least_two(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Dynamo compiles sizes 0 and 1 as separate cases, so a batch of one or a table
    one block wide would each cost a multi-second recompile mid-serving. Padding both
    to two (a dummy row of length 1; a column of block 0 that the mask hides) keeps
    every step on the one general kernel."""

    def call(query, k_cache, v_cache, block_tables, context_lens, scale):  # type: ignore[no-untyped-def]
        batch = query.shape[0]
        if block_tables.shape[1] == 1:
            block_tables = torch.nn.functional.pad(block_tables, (0, 1))
        if batch == 1:
            query = torch.cat([query, query])
            block_tables = torch.cat([block_tables, torch.zeros_like(block_tables)])
            context_lens = torch.cat([context_lens, torch.ones_like(context_lens)])
        return fn(query, k_cache, v_cache, block_tables, context_lens, scale)[:batch]

    return call


def install(kv_cache: torch.Tensor, num_q_heads: int, scale: float) -> Callable[..., torch.Tensor] | None:
    """The fused kernel compiled and checked for this pool (``[NB, 2, L, bs, Hkv, D]``),
    or None when it cannot be used here."""
    global _compiled
    if kv_cache.device.type != "cpu":
        return None
    key = (tuple(kv_cache.shape[1:]), num_q_heads, kv_cache.dtype, scale)
    if key in _validated and _compiled is not None:
        return _compiled
    try:
        # Default "automatic dynamic": the first call compiles with static sizes, the
        # second (another batch and width) recompiles with only those two symbolic. Head
        # sizes stay constants, which the generated C++ needs to vectorise well.
        fn = _compiled or _at_least_two(torch.compile(fused_decode_attention))
        _check(fn, kv_cache, num_q_heads, scale)
    except Exception as exc:  # no compiler, an Inductor bug, a mismatch: stay eager
        logger.warning("fused CPU decode attention unavailable, using the eager path: %s", exc)
        return None
    _compiled = fn
    _validated.add(key)
    return fn


@torch.inference_mode()
def _check(fn: Callable[..., torch.Tensor], kv_cache: torch.Tensor, num_q_heads: int, scale: float) -> None:
    """Compile on the real pool's strided layer views and compare with the eager path
    for batches and table widths of one and more. The first blocks are filled with
    noise and zeroed again afterwards (the pool is not in use yet)."""
    block_size, head_dim = kv_cache.shape[3], kv_cache.shape[5]
    used = min(kv_cache.shape[0], 8)
    gen = torch.Generator().manual_seed(0)
    kv_cache[:used].copy_(torch.randn(kv_cache[:used].shape, generator=gen).to(kv_cache.dtype))
    try:
        k_cache, v_cache = kv_cache[:, 0, 0], kv_cache[:, 1, 0]
        # The first call fixes the compiled case: its sizes must differ from every
        # other dimension, or Dynamo's duck sizing would tie them together.
        taken = {*kv_cache.shape, num_q_heads}
        first = [n for n in range(5, 64) if n not in taken][:2]
        for batch, width in (tuple(first), (1, 1), (3, 1), (1, 4), (6, 3)):
            tables = torch.randint(0, used, (batch, width), generator=gen, dtype=torch.int32)
            lens = torch.randint(
                (width - 1) * block_size + 1, width * block_size + 1, (batch,), generator=gen
            )
            lens = lens.to(torch.int32)
            query = torch.randn(batch, num_q_heads, head_dim, generator=gen).to(kv_cache.dtype)
            got = fn(query, k_cache, v_cache, tables, lens, scale)
            want = attention.decode_attention_torch(query, k_cache, v_cache, tables, lens, scale)
            if not torch.allclose(got.float(), want.float(), atol=1e-4, rtol=1e-4):
                raise RuntimeError(f"fused result differs by {(got - want).abs().max().item():.2e}")
    finally:
        kv_cache[:used].zero_()
