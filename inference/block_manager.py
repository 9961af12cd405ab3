"""Paged KV bookkeeping: which pool blocks each sequence uses, and the prefix cache.

- Every block has a reference count: the number of block tables that hold it.
- A *full* block whose K/V are computed gets a chained hash, xxh64(parent hash ‖
  its token ids), and is registered in ``hash -> block``. A later sequence whose
  leading tokens hash the same (tokens re-checked, so a collision cannot corrupt
  anyone) takes a reference instead of recomputing.
- A block whose count drops to 0 keeps its hash and joins an LRU list of
  *cached-free* blocks (an OrderedDict: O(1) append, pop-oldest and removal from
  the middle when a hit revives it). It is evicted only when the pool needs a block
  and no never-hashed block is left.
- Forking shares a table (counts + 1). A sequence about to write into a block that
  others also hold (the partly filled tail after a fork) gets a private copy first:
  the block manager allocates the copy and queues ``(src, dst)`` for the runner.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from inference.sequence import Sequence


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set only while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # a registered block's tokens, compared on a hit
    parent_hash: int = 0


@dataclass
class BlockStats:
    total: int
    used: int  # held by at least one sequence
    cached: int  # free, but holding a revivable prefix
    free: int  # free and empty
    hit_tokens: int  # prompt tokens served from the cache (first admissions)
    queried_tokens: int  # prompt tokens looked up

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def chain_hash(parent: int, token_ids: list[int]) -> int:
    """Hash of a full block given its parent's hash, so equal hashes mean equal prefixes."""
    return xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())


def salt_hash(salt: str) -> int:
    """A cache salt as the 64-bit value mixed into the chain (never 0, which means unsalted)."""
    return xxhash.xxh64_intdigest(b"cache-salt\0" + salt.encode()) or 1


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Never-hashed free blocks (a stack: reuse is order-free) are handed out before
        # cached ones, so that a cached prefix survives as long as possible.
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._by_hash: dict[int, int] = {}
        self._copies: list[tuple[int, int]] = []
        self.hit_tokens = 0
        self.queried_tokens = 0

    # ---- capacity -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._empty) + len(self._cached_free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def stats(self) -> BlockStats:
        free, cached = len(self._empty), len(self._cached_free)
        return BlockStats(
            self.num_blocks,
            self.num_blocks - free - cached,
            cached,
            free,
            self.hit_tokens,
            self.queried_tokens,
        )

    # ---- prefix cache ---------------------------------------------------------------
    def _hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of ``seq``'s first ``num_blocks`` full blocks (memoised on seq)."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(chain_hash(self._parent_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes

    @staticmethod
    def _parent_hash(seq: Sequence, i: int) -> int:
        """What block ``i``'s hash chains from: salted where the salt starts, which salts
        that block and, through the chain, every block after it."""
        parent = seq.block_hashes[i - 1] if i else 0
        if seq.cache_salt and i == seq.cache_salt_block:
            parent ^= seq.cache_salt
        return parent

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that can serve ``seq``'s leading tokens; read-only.

        At least the last token is left out, because the model must run it to produce
        the logits of the next one; so only blocks entirely before it count."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        for i, h in enumerate(self._hashes(seq, (seq.num_tokens - 1) // bs)):
            block_id = self._by_hash.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            parent = self._parent_hash(seq, i)
            if block.parent_hash != parent or block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                break  # a 64-bit collision: treat as a miss
            hits.append(block_id)
        return hits

    def num_revived(self, hits: list[int]) -> int:
        """How many of ``hits`` are currently free (taking them shrinks the free pool)."""
        return sum(1 for b in hits if self.blocks[b].ref_count == 0)

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give a sequence with no blocks the cached ``hits`` as its leading blocks."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.num_registered_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count a prompt's first admission in the hit-rate statistics."""
        self.queried_tokens += num_tokens
        self.hit_tokens += num_hit_tokens

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: publish blocks that became full (and computed) to the cache."""
        full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or full <= seq.num_registered_blocks:
            return
        hashes, bs = self._hashes(seq, full), self.block_size
        for i in range(seq.num_registered_blocks, full):
            block = self.blocks[seq.block_table[i]]
            # Another sequence may have computed the same prefix into a different block
            # at the same time; the first one registered stays canonical.
            if block.hash is None and hashes[i] not in self._by_hash:
                block.hash, block.parent_hash = hashes[i], self._parent_hash(seq, i)
                block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                self._by_hash[block.hash] = block.block_id
        seq.num_registered_blocks = full

    def reset_prefix_cache(self) -> int:
        """Forget every cached-free prefix (benchmarks start cold). Returns how many."""
        n = len(self._cached_free)
        while self._cached_free:
            block_id, _ = self._cached_free.popitem(last=False)
            self._evict(self.blocks[block_id])
            self._empty.append(block_id)
        return n

    # ---- allocation -----------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks ``allocate_slots(seq, num_new_tokens)`` would consume (an upper
        bound: forks sharing one tail each count a copy, though the last needs none)."""
        end = seq.num_computed_tokens + num_new_tokens
        new = max(0, self.blocks_for(end) - len(seq.block_table))
        return new + self._needs_copy(seq)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make positions ``[computed, computed + num_new_tokens)`` writable. Returns False
        (changing nothing) when the pool is short."""
        if self.blocks_needed(seq, num_new_tokens) > self.num_free_blocks:
            return False
        if self._needs_copy(seq):
            i = seq.num_computed_tokens // self.block_size
            src = seq.block_table[i]
            dst = self._allocate()
            self._copies.append((src, dst))
            self._release(src)
            seq.block_table[i] = dst
        end = seq.num_computed_tokens + num_new_tokens
        while len(seq.block_table) < self.blocks_for(end):
            seq.block_table.append(self._allocate())
        return True

    def _needs_copy(self, seq: Sequence) -> bool:
        """Is the next write into a block that another table also holds?"""
        i = seq.num_computed_tokens // self.block_size
        return i < len(seq.block_table) and self.blocks[seq.block_table[i]].ref_count > 1

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write work for the runner: ``pool[dst] = pool[src]`` before the step."""
        copies, self._copies = self._copies, []
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares all of ``parent``'s blocks (its token state is set by the caller)."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_registered_blocks = parent.num_registered_blocks
        child.num_computed_tokens = parent.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks, tail first, so the tail is evicted before the prefix
        that other conversations are likelier to share."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []

    # ---- internals ------------------------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._cached_free[block_id]  # a hit revives a cached-free block
        block.ref_count += 1

    def _allocate(self) -> int:
        if self._empty:
            block_id = self._empty.pop()
        else:
            block_id, _ = self._cached_free.popitem(last=False)  # least recently freed
            self._evict(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block: Block) -> None:
        del self._by_hash[block.hash]  # type: ignore[arg-type]
        block.hash, block.token_ids, block.parent_hash = None, (), 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None:
                self._cached_free[block_id] = None  # most recently freed: evicted last
            else:
                self._empty.append(block_id)
