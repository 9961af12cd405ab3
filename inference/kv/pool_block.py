"""One pool block's bookkeeping record, and how a block is named below the pool and in a
salt's namespace: shared by the block manager and the tier hand-offs."""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

from inference.engine.sequence import Sequence

NO_BLOCK = -1  # a sliding group's table entry whose block left the window (freed)


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set only while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # a registered block's tokens, compared on a hit
    parent_hash: int = 0
    namespace: int = 0  # the salt's namespace id (0: unsalted, shared by everyone)
    group: int = 0  # the KV group whose table holds it (while registered or in use)


def tier_hash(block_hash: int, group: int) -> int:
    """The name of group ``group``'s copy of a block in the tiers below the pool: every
    group caches the same token blocks, each in its own page."""
    if not group:
        return block_hash
    return xxhash.xxh64_intdigest(block_hash.to_bytes(8, "little") + group.to_bytes(4, "little"))


def block_namespace(seq: Sequence, i: int) -> int:
    """The namespace of ``seq``'s block ``i``: its salt's, from the salted block on."""
    return seq.cache_namespace if seq.cache_salt and i >= seq.cache_salt_block else 0
