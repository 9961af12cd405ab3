"""The blocks that cross the seam between the scheduler and the KV cache, as small types.

The scheduler sees block ids, tier names and these frozen values, never the block
manager's ``Block`` records or bare tuples read by position (vLLM's ``KVCacheBlocks``
plays this part there):

- ``CachedBlock``: a block of the prefix cache named as every tier names it.
- ``PrefixBlocks``: what a lookup found for a sequence, in the pool and below it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """A pool block registered in the prefix cache. A tier stores it under ``block_hash``
    and serves it only to a lookup naming the same parent hash, tokens and namespace."""

    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]
    block_id: int
    namespace: int = 0  # the salt's namespace id (0: unsalted, shared by everyone)


@dataclass(frozen=True, slots=True)
class PrefixBlocks:
    """A sequence's cached prefix: pool blocks serving its leading tokens (``hits``, block
    ids in order), then the tiers holding the blocks that continue it below the pool
    (``lower``, one tier name per block, in order)."""

    hits: tuple[int, ...]
    lower: tuple[str, ...]
    num_revived: int  # how many of ``hits`` are free now (taking them shrinks the free pool)

    @property
    def num_to_take(self) -> int:
        """Free pool blocks admitting it consumes: the revived hits and one per lower block."""
        return self.num_revived + len(self.lower)
