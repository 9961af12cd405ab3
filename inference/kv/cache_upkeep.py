"""The prefix cache's upkeep, part of ``BlockManager``: forgetting every cached prefix,
purging a salt's namespace (a deleted user's blocks, here and in the tiers), and retention
marks (an open conversation's history waits in its own cached-free list, evicted last)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from inference.kv.chain_hash import prefix_hashes
from inference.kv.pool_block import Block
from inference.kv.retention import Retention

if TYPE_CHECKING:
    from inference.kv.tiers import TierStack


class CacheUpkeep:
    """Mixed into ``BlockManager``, whose pool state these methods edit."""

    blocks: list[Block]
    block_size: int
    hash_root: int
    tiers: TierStack | None
    retention: Retention
    _empty: list[int]
    _cached_free: OrderedDict[int, None]
    _retained_free: OrderedDict[int, None]
    _hash_maps: list[dict[int, int]]

    def reset_prefix_cache(self) -> int:
        """Forget every cached-free prefix (benchmarks start cold). Returns how many."""
        n = len(self._cached_free) + len(self._retained_free)
        for free_list in (self._cached_free, self._retained_free):
            while free_list:
                block_id, _ = free_list.popitem(last=False)
                self._evict(self.blocks[block_id])
                self._empty.append(block_id)
        return n

    def purge_namespace(self, namespace: int) -> int:
        """Drop every block of ``namespace`` (a deleted user's) from the prefix cache: cached
        free ones become empty, ones still in use are unregistered (no lookup finds them,
        and they come back empty when freed), and the tiers drop theirs. The shared,
        unsalted namespace 0 is never purged. Returns the pool blocks dropped."""
        if not namespace:
            return 0
        dropped = 0
        for block in self.blocks:
            if block.hash is None or block.namespace != namespace:
                continue
            block_id = block.block_id
            if block.ref_count == 0:
                free_list = self._cached_free if block_id in self._cached_free else self._retained_free
                del free_list[block_id]
                self._empty.append(block_id)
            self._evict(block)
            dropped += 1
        if self.tiers is not None:
            self.tiers.purge_namespace(namespace)
        return dropped

    # ---- retention ------------------------------------------------------------------
    def retain(
        self, key: str, token_ids: list[int], salt: int = 0, salt_block: int = 0, adapter_key: int = 0
    ) -> int:
        """Mark the full blocks of ``token_ids`` as likely to be needed again (an open
        conversation's history); replaces what ``key`` retained before. ``salt`` /
        ``salt_block`` are the requests' cache salt, so the same blocks are named.
        Returns the number of blocks marked."""
        self.release(key)
        hashes = prefix_hashes(token_ids, self.block_size, salt, salt_block, self.hash_root ^ adapter_key)
        self.retention.mark(key, hashes)
        for h in hashes:
            for by_hash in self._hash_maps:
                block_id = by_hash.get(h)
                if block_id is not None and block_id in self._cached_free:
                    del self._cached_free[block_id]
                    self._retained_free[block_id] = None
        return len(hashes)

    def release(self, key: str) -> None:
        for h in self.retention.unmark(key):
            for by_hash in self._hash_maps:
                block_id = by_hash.get(h)
                if block_id is not None and block_id in self._retained_free:
                    del self._retained_free[block_id]
                    self._cached_free[block_id] = None  # most recently used end

    def is_retained(self, block_hash: int) -> bool:
        return self.retention.is_retained(block_hash)
