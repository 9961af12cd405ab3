"""The parts of prefill/decode disaggregation that need no process: the CPU split, the
shared-memory transfer, and importing blocks into the prefix cache."""

from __future__ import annotations

import pytest
import torch

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager
from inference.kv.chain_hash import prefix_hashes, salted_parent
from inference.pd.affinity import parse_cpus, plan_affinity
from inference.pd.transfer import MappedBlocks, discard, write_blocks


def test_parse_cpus() -> None:
    assert parse_cpus("0-3,6") == {0, 1, 2, 3, 6}
    assert parse_cpus(" 5 ") == {5}
    for bad in ("", "3-1", "-1"):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_auto_split_gives_each_process_an_equal_share() -> None:
    engine, workers = plan_affinity("auto", 1, frozenset(range(16)))
    assert engine == set(range(8)) and workers == [set(range(8, 16))]
    engine, workers = plan_affinity("auto", 2, frozenset(range(8)))
    assert engine == {0, 1} and workers == [{2, 3, 4}, {5, 6, 7}]
    assert not engine & workers[0] and not workers[0] & workers[1]


def test_auto_split_shares_cores_when_there_are_too_few() -> None:
    engine, workers = plan_affinity("auto", 2, frozenset({0, 1}))
    assert engine == {0} and workers == [{1}, {0}]


def test_off_and_explicit_settings() -> None:
    assert plan_affinity("off", 2, frozenset(range(4))) == (None, [None, None])
    engine, workers = plan_affinity("0-1;2-3;4", 2)
    assert engine == {0, 1} and workers == [{2, 3}, {4}]
    with pytest.raises(ValueError, match="needs 3"):
        plan_affinity("0-1;2-3", 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_round_trip_through_shared_memory(dtype: torch.dtype) -> None:
    blocks = torch.randn(3, 2, 4, 16, 2, 8).to(dtype)
    name, nbytes = write_blocks(blocks)
    assert nbytes == blocks.numel() * blocks.element_size()
    mapped = MappedBlocks(name, 3, tuple(blocks.shape[1:]), dtype)
    try:
        assert torch.equal(mapped.blocks, blocks)
    finally:
        mapped.close()
    discard(name)  # already unlinked: a no-op


def test_imported_blocks_are_prefix_hits() -> None:
    bs = 4
    bm = BlockManager(num_blocks=8, block_size=bs)
    pool = torch.zeros(8, 2, 1, bs, 1, 2)
    tokens = list(range(100, 111))  # 2 full blocks before the last token
    hashes = prefix_hashes(tokens[: 2 * bs], bs)
    data = torch.randn(2, *pool.shape[1:])
    for i, h in enumerate(hashes):
        block_tokens = tuple(tokens[i * bs : (i + 1) * bs])
        assert bm.import_block(
            h, salted_parent(hashes, i), block_tokens, 0, lambda b, i=i: pool[b].copy_(data[i])
        )
    # Importing the same hash again changes nothing.
    assert not bm.import_block(hashes[0], 0, tuple(tokens[:bs]), 0, lambda b: None)
    assert bm.num_free_blocks == 8  # cached-free: revivable, evictable
    seq = Sequence(list(tokens), len(tokens))
    hits = bm.match_prefix(seq)
    assert len(hits) == 2
    for i, block_id in enumerate(hits):
        assert torch.equal(pool[block_id], data[i])
    # Another prompt with the same first block but a different second one hits only the first.
    other = Sequence(tokens[:bs] + [1, 2, 3, 4, 5], 9)
    assert bm.match_prefix(other) == hits[:1]
