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
- **Retention** (``retain(key, token_ids)`` / ``release(key)``): the full blocks of a
  marked prefix (an open conversation's history) wait in a second cached-free list
  that is evicted only when the first is empty; an evicted retained block is written
  to the next tier with ``force`` (never dropped on the way down). The marks live in
  ``inference.kv.retention``, which the tiers read too.
- **Lower tiers** (``tiers``, optional): a registered block is written through to them,
  an evicted one handed down, and ``match_lower`` continues a prefix lookup past the
  pool's last hit; ``start_loads`` copies those blocks into fresh pool blocks
  (``inference.kv.tiers``).
- **Namespaces** (``inference.kv.salt``): a salted block keeps its salt's namespace id;
  ``purge_namespace`` drops a namespace's cached blocks here and in the tiers, and
  unregisters its blocks still in use, so they are never served again and go back
  empty when freed.
- Forking shares a table (counts + 1). A sequence about to write into a block that
  others also hold (the partly filled tail after a fork) gets a private copy first:
  the block manager allocates the copy and queues ``(src, dst)`` for the runner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.engine.sequence import Sequence
from inference.kv.block_stats import BlockStats
from inference.kv.blocks import CachedBlock, PrefixBlocks
from inference.kv.chain_hash import chain_hash, prefix_hashes, salted_parent
from inference.kv.retention import Retention
from inference.kv.salt import salt_hash as salt_hash  # re-exported: callers hash salts here

if TYPE_CHECKING:
    from inference.kv.tiers import TierStack


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set only while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # a registered block's tokens, compared on a hit
    parent_hash: int = 0
    namespace: int = 0  # the salt's namespace id (0: unsalted, shared by everyone)


def block_namespace(seq: Sequence, i: int) -> int:
    """The namespace of ``seq``'s block ``i``: its salt's, from the salted block on."""
    return seq.cache_namespace if seq.cache_salt and i >= seq.cache_salt_block else 0


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        tiers: TierStack | None = None,
        retention: Retention | None = None,
        hash_root: int = 0,
    ) -> None:
        """``tiers`` (the stack below the pool, if any) and ``retention`` (the registry those
        tiers ask too; a private one by default) are this manager's for its lifetime.
        ``hash_root`` (``chain_hash.hash_root``) starts every chain: the served model's."""
        self.block_size = block_size
        self.hash_root = hash_root
        self.enable_prefix_caching = enable_prefix_caching
        self.tiers = tiers
        self.retention = retention if retention is not None else Retention()
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Never-hashed free blocks (a stack: reuse is order-free) are handed out before
        # cached ones, so that a cached prefix survives as long as possible.
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._retained_free: OrderedDict[int, None] = OrderedDict()  # cached-free and retained
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
        return len(self._empty) + len(self._cached_free) + len(self._retained_free)

    @property
    def num_retained_keys(self) -> int:
        return self.retention.num_keys

    @property
    def num_retained_blocks(self) -> int:
        """Distinct block hashes some key retains (held in the pool or not)."""
        return self.retention.num_hashes

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def stats(self) -> BlockStats:
        free, cached = len(self._empty), len(self._cached_free) + len(self._retained_free)
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

    def seq_root(self, seq: Sequence) -> int:
        """Where ``seq``'s chain starts: the model's root, with its adapter's key mixed in."""
        return self.hash_root ^ seq.adapter_key

    def _parent_hash(self, seq: Sequence, i: int) -> int:
        return salted_parent(seq.block_hashes, i, seq.cache_salt, seq.cache_salt_block, self.seq_root(seq))

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
            if (
                block.parent_hash != parent
                or block.namespace != block_namespace(seq, i)
                or block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs])
            ):
                break  # a 64-bit collision: treat as a miss
            hits.append(block_id)
        return hits

    def num_revived(self, hits: Collection[int]) -> int:
        """How many of ``hits`` are currently free (taking them shrinks the free pool)."""
        return sum(1 for b in hits if self.blocks[b].ref_count == 0)

    def admit(self, seq: Sequence, hits: Collection[int]) -> None:
        """Give a sequence with no blocks the cached ``hits`` as its leading blocks."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.num_registered_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size

    def record_lookup(self, num_tokens: int, num_hit_tokens: int, num_loaded_tokens: int = 0) -> None:
        """Count a prompt's first admission in the hit-rate statistics (``num_loaded_tokens``
        of the hits came from lower tiers just before; the rest were in the pool)."""
        self.queried_tokens += num_tokens
        self.hit_tokens += num_hit_tokens
        if self.tiers is not None:
            self.tiers.counters.hit_tokens["pool"] += max(0, num_hit_tokens - num_loaded_tokens)

    def registered_blocks(self, seq: Sequence) -> list[CachedBlock]:
        """``seq``'s blocks in the prefix cache, in order."""
        blocks = (self.blocks[b] for b in seq.block_table[: seq.num_registered_blocks])
        return [
            CachedBlock(b.hash, b.parent_hash, b.token_ids, b.block_id, b.namespace)
            for b in blocks
            if b.hash is not None
        ]

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: publish blocks that became full (and computed) to the cache."""
        full = seq.num_computed_tokens // self.block_size
        # A purged namespace's running request publishes nothing more (see purge_namespace).
        if not self.enable_prefix_caching or seq.cache_private or full <= seq.num_registered_blocks:
            return
        hashes, bs = self._hashes(seq, full), self.block_size
        for i in range(seq.num_registered_blocks, full):
            block = self.blocks[seq.block_table[i]]
            # Another sequence may have computed the same prefix into a different block
            # at the same time; the first one registered stays canonical.
            if block.hash is None and hashes[i] not in self._by_hash:
                block.hash, block.parent_hash = hashes[i], self._parent_hash(seq, i)
                block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                block.namespace = block_namespace(seq, i)
                self._by_hash[block.hash] = block.block_id
                if self.tiers is not None:
                    self.tiers.block_cached(
                        block.hash, block.parent_hash, block.token_ids, block.block_id, block.namespace
                    )
        seq.num_registered_blocks = full

    def cached_block(self, block_hash: int) -> int | None:
        """The pool block registered under ``block_hash``, if any."""
        return self._by_hash.get(block_hash)

    def import_block(
        self,
        block_hash: int,
        parent: int,
        tokens: tuple[int, ...],
        namespace: int,
        fill: Callable[[int], None],
    ) -> bool:
        """Register a block computed elsewhere (a prefill worker) as cached and free, as if
        a finished sequence had left it: ``fill(block_id)`` writes its K/V into the pool
        first. False (nothing changed) when that hash is cached already or no block is free."""
        if not self.enable_prefix_caching or block_hash in self._by_hash or not self.num_free_blocks:
            return False
        block_id = self._allocate()
        fill(block_id)
        block = self.blocks[block_id]
        block.hash, block.parent_hash, block.token_ids, block.namespace = (
            block_hash,
            parent,
            tokens,
            namespace,
        )
        self._by_hash[block_hash] = block_id
        if self.tiers is not None:
            self.tiers.block_cached(block_hash, parent, tokens, block_id, namespace)
        self._release(block_id)
        return True

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
            block_id = self._by_hash.get(h)
            if block_id is not None and block_id in self._cached_free:
                del self._cached_free[block_id]
                self._retained_free[block_id] = None
        return len(hashes)

    def release(self, key: str) -> None:
        for h in self.retention.unmark(key):
            block_id = self._by_hash.get(h)
            if block_id is not None and block_id in self._retained_free:
                del self._retained_free[block_id]
                self._cached_free[block_id] = None  # most recently used end

    def is_retained(self, block_hash: int) -> bool:
        return self.retention.is_retained(block_hash)

    # ---- lower tiers ----------------------------------------------------------------
    def match_lower(self, seq: Sequence, start: int) -> list[str]:
        """The tiers holding ``seq``'s blocks ``start, start + 1, ...`` (the hash chain
        continued below the pool), up to the first block no tier has; same rule as
        ``match_prefix`` about the last token."""
        if self.tiers is None or not self.enable_prefix_caching:
            return []
        bs = self.block_size
        found: list[str] = []
        hashes = self._hashes(seq, (seq.num_tokens - 1) // bs)
        for i in range(start, len(hashes)):
            if hashes[i] in self._by_hash:
                break  # in the pool after all (a later admission will revive it)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            tier = self.tiers.find(hashes[i], self._parent_hash(seq, i), tokens, block_namespace(seq, i))
            if tier is None:
                break
            found.append(tier)
        return found

    def prefix_to_load(self, seq: Sequence) -> PrefixBlocks | None:
        """``seq``'s cached prefix when it continues in a lower tier and the tiers' cost model
        says reading those blocks beats recomputing them; None otherwise."""
        if self.tiers is None:
            return None
        hits = self.match_prefix(seq)
        lower = self.match_lower(seq, len(hits))
        if not lower or not self.tiers.worth_loading(lower):
            return None
        return PrefixBlocks(tuple(hits), tuple(lower), self.num_revived(hits))

    def swap_out(self, seq: Sequence) -> bool:
        """``seq`` is preempted: True when the tiers took its cached blocks (a swap; a lookup
        finds them at re-admission), False when it is to be recomputed (the tiers' call)."""
        return self.tiers is not None and self.tiers.swap_out(
            self.registered_blocks(seq), seq.num_computed_tokens
        )

    def start_loads(self, seq: Sequence, tiers: Collection[str]) -> None:
        """Fresh pool blocks for the next ``len(tiers)`` blocks of ``seq`` (admitted with
        its pool hits), each filled from its tier; ``complete_loads`` finishes them."""
        assert self.tiers is not None and len(seq.block_table) * self.block_size == seq.num_computed_tokens
        bs, start = self.block_size, len(seq.block_table)
        for i, tier in enumerate(tiers, start):
            block_id = self._allocate()
            seq.block_table.append(block_id)
            parent = self._parent_hash(seq, i)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            seq.pending_loads.append(
                self.tiers.start_load(
                    tier, seq.block_hashes[i], parent, tokens, block_id, block_namespace(seq, i)
                )
            )

    def loads_done(self, seq: Sequence) -> bool:
        return all(load.done() for load in seq.pending_loads)

    def complete_loads(self, seq: Sequence, count_hits: bool = True) -> int:
        """Copy the finished reads into the pool and count the served blocks as computed
        (registered in the prefix cache); stops at the first block that could not be
        served, whose tokens are then recomputed. Returns the tokens served."""
        assert self.tiers is not None
        served = 0
        for load in seq.pending_loads:
            if not self.tiers.finish_load(load):
                break
            if count_hits:  # a first admission's prefix hit (not a swap-in)
                self.tiers.counters.hit_tokens[load.tier] += self.block_size
            self.tiers.counters.loaded_blocks += 1
            served += self.block_size
        seq.pending_loads = []
        seq.num_computed_tokens += served
        self.register_full_blocks(seq)
        return served

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

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks holding ``seq``'s first ``num_tokens`` positions: the
        blocks of rejected speculative tokens go back, tail first (they were never
        registered: only computed, accepted tokens are)."""
        keep = self.blocks_for(num_tokens)
        assert keep >= seq.num_registered_blocks, "truncating into registered blocks"
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks, tail first, so the tail is evicted before the prefix
        that other conversations are likelier to share."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []

    # ---- internals ------------------------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:  # a hit revives a cached-free block
            if block_id in self._cached_free:
                del self._cached_free[block_id]
            else:
                del self._retained_free[block_id]
        block.ref_count += 1

    def _allocate(self) -> int:
        if self._empty:
            block_id = self._empty.pop()
        else:
            # Least recently freed first; retained prefixes only when nothing else is left.
            retained = not self._cached_free
            free_list = self._retained_free if retained else self._cached_free
            block_id, _ = free_list.popitem(last=False)
            block = self.blocks[block_id]
            if self.tiers is not None:
                self.tiers.block_evicted(
                    block.hash,  # type: ignore[arg-type]
                    block.parent_hash,
                    block.token_ids,
                    block_id,
                    block.namespace,
                    retained=retained,
                )
            self._evict(block)
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block: Block) -> None:
        del self._by_hash[block.hash]  # type: ignore[arg-type]
        block.hash, block.token_ids, block.parent_hash, block.namespace = None, (), 0, 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None:
                # Most recently freed: evicted last (in its list).
                if self.retention.is_retained(block.hash):
                    self._retained_free[block_id] = None
                else:
                    self._cached_free[block_id] = None
            else:
                self._empty.append(block_id)
