"""The seams between the scheduler and the KV cache, pinned without a model: the retention
registry the block manager and the tiers share, the typed blocks the scheduler sees, the
tiers' own swap and load policy, step-local planning state, and collaborators given at
construction."""

from __future__ import annotations

from inference.kv.block_manager import BlockManager
from inference.kv.chain_hash import prefix_hashes
from inference.kv.retention import Retention

BS = 4


def test_retention_counts_keys_per_hash_and_reports_what_one_unmark_releases() -> None:
    retention = Retention()
    retention.mark("a", [1, 2, 3])
    retention.mark("b", [1, 2])
    assert retention.is_retained(3) and retention.num_keys == 2 and retention.num_hashes == 3
    assert set(retention.keys()) == {"a", "b"} and retention.hashes("b") == [1, 2]
    assert retention.unmark("a") == [3]  # 1 and 2 are still b's
    assert retention.unmark("b") == [1, 2] and retention.unmark("b") == []
    assert retention.hashes("a") == [] and not retention.is_retained(1)


def test_a_block_manager_shares_the_retention_it_is_built_with() -> None:
    retention = Retention()
    bm = BlockManager(8, BS, retention=retention)
    tokens = list(range(1, 10))
    assert bm.retain("conv", tokens) == 2
    assert retention.hashes("conv") == prefix_hashes(tokens, BS)
    assert all(retention.is_retained(h) for h in prefix_hashes(tokens, BS))
    bm.release("conv")
    assert retention.num_keys == 0 and bm.num_retained_blocks == 0
    assert BlockManager(8, BS).retention is not BlockManager(8, BS).retention  # private by default
