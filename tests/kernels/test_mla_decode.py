"""The Triton MLA decode kernel (absorbed queries over the latent pool) against
``mla_decode_ref`` and against the engine's PyTorch path."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels.reference import mla_decode_ref
from inference.layers.mla_attention import mla_decode_latent_torch
from tests.kernels.cases import ATOL, DEVICE, max_err, requires_backend

requires_backend()
triton_ops = pytest.importorskip("chatsite_kernels.triton.ops")


def latent_batch(context_lens: list[int], heads: int, rank: int, rope: int, block_size: int, seed: int = 0):
    """A pool ``[num_blocks, 1, layers, block_size, r + rope]`` full of random values (so a
    read past a length or from a wrong block shows), shuffled block tables with padding."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(per_seq) + 5
    pool = torch.randn(num_blocks, 1, 2, block_size, rank + rope, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(context_lens), max(per_seq) + 2, dtype=torch.int32)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = perm[used : used + n]
        used += n
    query = torch.randn(len(context_lens), heads, rank + rope, generator=gen)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return query.to(DEVICE), pool.to(DEVICE)[:, 0, 1], tables.to(DEVICE), lens.to(DEVICE)


@pytest.mark.parametrize(
    ("context_lens", "heads", "rank", "rope", "block_size"),
    [
        pytest.param([1, 17, 40, 16], 4, 32, 8, 16, id="tiny-deepseek-shape"),
        pytest.param([5, 63, 64, 33], 20, 48, 16, 8, id="heads-past-one-tile-rank-not-pow2"),
    ],
)
def test_mla_decode_matches_the_reference(context_lens, heads, rank, rope, block_size) -> None:
    query, cache, tables, lens = latent_batch(context_lens, heads, rank, rope, block_size)
    assert not cache.is_contiguous()  # a strided view of the pool, as in the engine
    scale = 0.3
    out = triton_ops.mla_decode_attention(query, cache, tables, lens, scale, rank, block_n=16)
    ref = mla_decode_ref(query, cache, tables, lens, scale, rank)
    assert out.shape == (len(context_lens), heads, rank)
    assert max_err(out, ref) <= ATOL[torch.float32]
    engine_path = mla_decode_latent_torch(query.cpu(), cache.cpu(), tables.cpu(), lens.cpu(), scale, rank)
    assert max_err(engine_path, ref.cpu()) <= ATOL[torch.float32]
