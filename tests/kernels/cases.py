"""Builders shared by the kernel tests: paged caches with shuffled block tables."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")

# Max abs error allowed against the fp32 references, per dtype. Under the interpreter
# everything is computed in fp32 and only the final store rounds (the interpreter's
# fp32->bf16 cast truncates where torch rounds to nearest: up to 1 ulp). On a GPU,
# bf16/fp16 operands feed the tensor cores, adding the rounding of P to 16 bits.
ATOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def requires_backend() -> None:
    """Call at a test module's import: skip it (visibly) where the kernels cannot run."""
    pytest.importorskip("triton", reason="triton is not installed (the engine's CPU path does not need it)")
    if DEVICE.type == "cpu" and not INTERPRET:
        pytest.skip(reason="no CUDA device and TRITON_INTERPRET is not 1", allow_module_level=True)


@dataclass
class PagedBatch:
    query: torch.Tensor  # [T, Hq, D]
    pool: torch.Tensor  # [num_blocks, 2, num_layers, block_size, Hkv, D]
    k_cache: torch.Tensor  # strided view pool[:, 0, layer]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, shuffled, padded with 0
    query_start_loc: torch.Tensor  # [B+1] int32
    context_lens: torch.Tensor  # [B] int32
    scale: float


def reference(batch: PagedBatch) -> torch.Tensor:
    """The oracle: ``chatsite_kernels.reference.paged_attention_ref`` on the batch."""
    from chatsite_kernels.reference import paged_attention_ref

    return paged_attention_ref(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
    )


def make_batch(
    pairs: list[tuple[int, int]],
    *,
    block_size: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    num_layers: int = 2,
    layer: int = 1,
    spare_blocks: int = 7,
    extra_table_cols: int = 2,
    seed: int = 0,
) -> PagedBatch:
    """``pairs`` are (query_len, context_len). Every cache slot, used or not, holds
    random values, so a kernel reading the wrong block or past a length is caught.
    Blocks are handed out in a random order, and tables get padding columns."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-ctx // block_size) for _, ctx in pairs]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    pool = torch.randn(num_blocks, 2, num_layers, block_size, kv_heads, head_dim, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_per_seq) + extra_table_cols
    tables = torch.zeros(len(pairs), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = perm[used : used + n]
        used += n
    q_lens = [q for q, _ in pairs]
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(q_lens), q_heads, head_dim, generator=gen)
    pool = pool.to(dtype).to(DEVICE)
    return PagedBatch(
        query=query.to(dtype).to(DEVICE),
        pool=pool,
        k_cache=pool[:, 0, layer],
        v_cache=pool[:, 1, layer],
        block_tables=tables.to(DEVICE),
        query_start_loc=qsl.to(DEVICE),
        context_lens=torch.tensor([c for _, c in pairs], dtype=torch.int32, device=DEVICE),
        scale=head_dim**-0.5,
    )


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()
