"""store_kv against ``store_kv_ref`` on strided views of the engine's KV pool."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels.reference import store_kv_ref
from tests.kernels.cases import DEVICE, requires_backend

requires_backend()
triton_ops = pytest.importorskip("chatsite_kernels.triton.ops")


@pytest.mark.parametrize(
    ("block_size", "kv_heads", "head_dim", "dtype"),
    [
        (16, 3, 64, torch.float32),  # SmolLM2: 3 heads x 64 is not a power of two
        (32, 8, 128, torch.bfloat16),
        (16, 1, 128, torch.float16),
    ],
)
def test_store_kv_matches_reference(block_size, kv_heads, head_dim, dtype):
    gen = torch.Generator().manual_seed(1)
    num_blocks, num_layers, layer = 9, 3, 2
    pool = torch.randn(num_blocks, 2, num_layers, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    num_tokens = 40
    # Distinct random slots across non-adjacent blocks, with a few -1 (skip) entries.
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[0, 7, 39]] = -1
    # K and V as the engine has them: views into a fused QKV projection output.
    qkv = torch.randn(num_tokens, (4 + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    key = qkv[:, 4 * head_dim : (4 + kv_heads) * head_dim].view(num_tokens, kv_heads, head_dim)
    value = qkv[:, (4 + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)

    expected = pool.clone()
    store_kv_ref(key, value, expected[:, 0, layer], expected[:, 1, layer], slots)

    pool = pool.to(DEVICE)
    triton_ops.store_kv(
        key.to(DEVICE), value.to(DEVICE), pool[:, 0, layer], pool[:, 1, layer], slots.to(DEVICE)
    )
    # A pure copy: bit-exact, and every other layer, block and slot untouched.
    assert torch.equal(pool.cpu(), expected)


def test_store_kv_all_skipped_and_empty():
    pool = torch.randn(4, 2, 1, 16, 3, 64, device=DEVICE)
    before = pool.clone()
    kv = torch.randn(5, 3, 64, device=DEVICE)
    slots = torch.full((5,), -1, dtype=torch.int64, device=DEVICE)
    triton_ops.store_kv(kv, kv, pool[:, 0, 0], pool[:, 1, 0], slots)
    empty = kv[:0]
    triton_ops.store_kv(empty, empty, pool[:, 0, 0], pool[:, 1, 0], slots[:0])
    assert torch.equal(pool, before)
