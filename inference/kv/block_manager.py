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
- **KV groups** (``inference.kv.spec``): a model with sliding-window layers has one block
  table per group of layers (``seq.block_table`` is group 0's, ``seq.group_tables`` the
  rest's; all index the same pool). A sliding group's blocks that no future query can
  reach (entirely before ``next position - window + 1``) go back to the pool after each
  step (``NO_BLOCK`` marks their place). A prefix hit of ``k`` blocks then needs the full
  groups' blocks ``0..k-1`` and each sliding group's blocks of the last window before
  position ``k * block_size`` only; every group keeps its own ``hash -> block`` map, and
  the tiers store group ``g``'s copy under ``tier_hash(hash, g)``.
- Forking shares a table (counts + 1). A sequence about to write into a block that
  others also hold (the partly filled tail after a fork) gets a private copy first:
  the block manager allocates the copy and queues ``(src, dst)`` for the runner.

The class is one owner in three modules: this one (reference counts, lookup, allocation),
``cache_upkeep`` (purges and retention marks) and ``tier_handoffs`` (imports, lookups and
loads below the pool), mixed in; the property tests check their invariants as one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING

from inference.engine.sequence import Sequence
from inference.kv.block_stats import BlockStats
from inference.kv.blocks import CachedBlock
from inference.kv.cache_upkeep import CacheUpkeep
from inference.kv.chain_hash import chain_hash, salted_parent
from inference.kv.pool_block import NO_BLOCK as NO_BLOCK  # re-exported: callers test table entries
from inference.kv.pool_block import Block, block_namespace, tier_hash
from inference.kv.retention import Retention
from inference.kv.salt import salt_hash as salt_hash  # re-exported: callers hash salts here
from inference.kv.spec import KVGroup
from inference.kv.tier_handoffs import TierHandoffs

if TYPE_CHECKING:
    from inference.kv.tiers import TierStack


class BlockManager(CacheUpkeep, TierHandoffs):
    # Whether a speculative verify step (one row per proposed position) can run on this
    # pool; a hybrid model's recurrent state cannot be rolled back position by position.
    supports_speculation = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        tiers: TierStack | None = None,
        retention: Retention | None = None,
        groups: tuple[KVGroup, ...] = (KVGroup(None, ()),),
        hash_root: int = 0,
    ) -> None:
        """``tiers`` (the stack below the pool, if any) and ``retention`` (the registry those
        tiers ask too; a private one by default) are this manager's for its lifetime.
        ``groups``: the model's KV groups (``KVSpec.groups``); only their windows matter here.
        ``hash_root`` (``chain_hash.hash_root``) starts every chain: the served model's."""
        self.block_size = block_size
        self.hash_root = hash_root
        self.enable_prefix_caching = enable_prefix_caching
        self.tiers = tiers
        self.retention = retention if retention is not None else Retention()
        self.windows: tuple[int | None, ...] = tuple(g.window for g in groups)
        self._sliding = any(w is not None for w in self.windows)
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Never-hashed free blocks (a stack: reuse is order-free) are handed out before
        # cached ones, so that a cached prefix survives as long as possible.
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._retained_free: OrderedDict[int, None] = OrderedDict()  # cached-free and retained
        self._by_hash: dict[int, int] = {}  # group 0's; the others' follow in _hash_maps
        self._hash_maps: list[dict[int, int]] = [self._by_hash, *({} for _ in self.windows[1:])]
        self._copies: list[tuple[int, int]] = []
        self.hit_tokens = 0
        self.queried_tokens = 0

    # ---- capacity -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

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

    def tables(self, seq: Sequence) -> list[list[int]]:
        """``seq``'s block table of each group (the lists themselves, for editing)."""
        if self.num_groups == 1:
            return [seq.block_table]
        while len(seq.group_tables) < self.num_groups - 1:
            seq.group_tables.append([])
        return [seq.block_table, *seq.group_tables]

    def num_held_blocks(self, seq: Sequence) -> int:
        """Pool blocks ``seq``'s tables hold (sliding groups' dropped entries not counted)."""
        return sum(1 for table in self.tables(seq) for b in table if b != NO_BLOCK)

    def first_needed_block(self, group: int, position: int) -> int:
        """The first block of ``group`` a query at ``position`` (or later) still reads: 0
        for a full-attention group; a sliding one reads keys from ``position - window + 1``."""
        window = self.windows[group]
        if window is None:
            return 0
        return max(0, position - window + 1) // self.block_size

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

    def _lookup(self, seq: Sequence, group: int, i: int) -> int | None:
        """The pool block of ``group`` cached for ``seq``'s block ``i`` (hashes computed),
        or None; a 64-bit collision (other parent, namespace or tokens) is a miss."""
        block_id = self._hash_maps[group].get(seq.block_hashes[i])
        if block_id is None:
            return None
        bs, block = self.block_size, self.blocks[block_id]
        if (
            block.parent_hash != self._parent_hash(seq, i)
            or block.namespace != block_namespace(seq, i)
            or block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs])
        ):
            return None
        return block_id

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Group 0's table for the longest cached prefix that can serve ``seq``'s leading
        tokens (``NO_BLOCK`` where a sliding group needs nothing); read-only. The prefix
        is ``len(result)`` blocks long; ``admit`` finds the other groups' blocks again.

        At least the last token is left out, because the model must run it to produce
        the logits of the next one; so only blocks entirely before it count."""
        if not self.enable_prefix_caching or seq.score_prompt:
            return []  # a prompt being scored must run every token (cached ones have no logits)
        return self._prefix_tables(seq)[0]

    def _prefix_tables(self, seq: Sequence, length: int | None = None) -> list[list[int]]:
        """Every group's table for the longest servable prefix (of at most ``length``
        blocks). Full groups need each block from the start; a sliding group needs an
        unbroken run of its blocks from ``first_needed_block`` up to the prefix's end."""
        limit = (seq.num_tokens - 1) // self.block_size
        hashes = self._hashes(seq, limit if length is None else min(limit, length))
        found: list[list[int | None]] = []
        end = len(hashes)
        for g, window in enumerate(self.windows):
            column: list[int | None] = []
            for i in range(end):
                block_id = self._lookup(seq, g, i)
                if block_id is None and window is None:
                    end = i  # a full group's first miss ends the prefix
                    break
                column.append(block_id)
            found.append(column)
        # The longest prefix every sliding group can serve: its needed blocks all present.
        while end:
            if all(
                all(
                    found[g][i] is not None
                    for i in range(self.first_needed_block(g, end * self.block_size), end)
                )
                for g, w in enumerate(self.windows)
                if w is not None
            ):
                break
            end -= 1
        tables = []
        for g, column in enumerate(found):
            first = self.first_needed_block(g, end * self.block_size)
            tables.append([NO_BLOCK if i < first else column[i] for i in range(end)])  # type: ignore[misc]
        return tables

    def num_revived(self, hits: Collection[int], seq: Sequence | None = None) -> int:
        """How many of ``hits`` are currently free (taking them shrinks the free pool); with
        ``seq`` (the sequence ``hits`` were matched for), over every group's blocks."""
        if seq is not None and self.num_groups > 1:
            hits = [b for table in self._prefix_tables(seq, len(hits)) for b in table]
        return sum(1 for b in hits if b != NO_BLOCK and self.blocks[b].ref_count == 0)

    def admit(self, seq: Sequence, hits: Collection[int]) -> None:
        """Give a sequence with no blocks the cached ``hits`` (``match_prefix``'s answer for
        it) as its leading blocks, and the other groups' blocks of the same prefix."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        tables = self._prefix_tables(seq, len(hits)) if self.num_groups > 1 else [list(hits)]
        assert len(tables[0]) == len(hits), "admit takes match_prefix's answer for this sequence"
        for table, found in zip(self.tables(seq), tables, strict=True):
            assert not table
            for block_id in found:
                if block_id != NO_BLOCK:
                    self._take(block_id)
            table.extend(found)
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
        """``seq``'s blocks in the prefix cache (every group's, named as the tiers name
        them), in order."""
        out = []
        for table in self.tables(seq):
            for block_id in table[: seq.num_registered_blocks]:
                b = self.blocks[block_id] if block_id != NO_BLOCK else None
                if b is not None and b.hash is not None:
                    out.append(
                        CachedBlock(
                            tier_hash(b.hash, b.group), b.parent_hash, b.token_ids, b.block_id, b.namespace
                        )
                    )
        return out

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: publish blocks that became full (and computed) to the cache, then
        return the sliding groups' blocks no later query reads."""
        full = seq.num_computed_tokens // self.block_size
        # A purged namespace's running request publishes nothing more (see purge_namespace).
        if self.enable_prefix_caching and not seq.cache_private and full > seq.num_registered_blocks:
            self._register(seq, full)
        self.drop_out_of_window(seq)

    def _register(self, seq: Sequence, full: int) -> None:
        hashes, bs = self._hashes(seq, full), self.block_size
        for g, table in enumerate(self.tables(seq)):
            by_hash = self._hash_maps[g]
            for i in range(seq.num_registered_blocks, full):
                if table[i] == NO_BLOCK:
                    continue
                block = self.blocks[table[i]]
                # Another sequence may have computed the same prefix into a different block
                # at the same time; the first one registered stays canonical.
                if block.hash is None and hashes[i] not in by_hash:
                    block.hash, block.parent_hash = hashes[i], self._parent_hash(seq, i)
                    block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                    block.namespace = block_namespace(seq, i)
                    block.group = g
                    by_hash[block.hash] = block.block_id
                    if self.tiers is not None:
                        self.tiers.block_cached(
                            tier_hash(block.hash, g),
                            block.parent_hash,
                            block.token_ids,
                            block.block_id,
                            block.namespace,
                        )
        seq.num_registered_blocks = full

    def drop_out_of_window(self, seq: Sequence) -> int:
        """Return each sliding group's blocks that no query from ``seq``'s next position on
        reads (registered ones stay revivable in the prefix cache). Returns how many."""
        dropped = 0
        if not self._sliding:
            return 0
        for g, table in enumerate(self.tables(seq)):
            if self.windows[g] is None:
                continue
            first = min(self.first_needed_block(g, seq.num_computed_tokens), len(table))
            for i in range(first - 1, -1, -1):
                if table[i] == NO_BLOCK:
                    break  # everything before was dropped earlier
                self._release(table[i])
                table[i] = NO_BLOCK
                dropped += 1
        return dropped

    def cached_block(self, block_hash: int, group: int = 0) -> int | None:
        """The pool block of ``group`` registered under ``block_hash``, if any."""
        return self._hash_maps[group].get(block_hash)

    # ---- allocation -----------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks ``allocate_slots(seq, num_new_tokens)`` would consume (an upper
        bound: forks sharing one tail each count a copy, though the last needs none)."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        return sum(max(0, need - len(table)) + self._needs_copy(seq, table) for table in self.tables(seq))

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make positions ``[computed, computed + num_new_tokens)`` writable. Returns False
        (changing nothing) when the pool is short."""
        if self.blocks_needed(seq, num_new_tokens) > self.num_free_blocks:
            return False
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        for table in self.tables(seq):
            if self._needs_copy(seq, table):
                i = seq.num_computed_tokens // self.block_size
                src = table[i]
                dst = self._allocate()
                self._copies.append((src, dst))
                self._release(src)
                table[i] = dst
            while len(table) < need:
                table.append(self._allocate())
        return True

    def _needs_copy(self, seq: Sequence, table: list[int] | None = None) -> bool:
        """Is the next write into a block that another table also holds?"""
        table = seq.block_table if table is None else table
        i = seq.num_computed_tokens // self.block_size
        return i < len(table) and table[i] != NO_BLOCK and self.blocks[table[i]].ref_count > 1

    def holds_next_slot(self, seq: Sequence) -> bool:
        """Does ``seq`` alone hold the block its next token is written to, in every group
        (so that decoding it needs no allocation and no copy)?"""
        i = seq.num_computed_tokens // self.block_size
        for table in self.tables(seq):
            if i >= len(table) or self.blocks[table[i]].ref_count != 1:
                return False
        return True

    def chunk_limit(self, seq: Sequence, num_new_tokens: int) -> int:
        """How many of ``num_new_tokens`` prompt tokens one step may run for ``seq``: all of
        them here; a hybrid model's manager cuts chunks where it saves states."""
        return num_new_tokens

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write work for the runner: ``pool[dst] = pool[src]`` before the step."""
        copies, self._copies = self._copies, []
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares all of ``parent``'s blocks (its token state is set by the caller)."""
        for parent_table, child_table in zip(self.tables(parent), self.tables(child), strict=True):
            for block_id in parent_table:
                if block_id != NO_BLOCK:
                    self.blocks[block_id].ref_count += 1
            child_table[:] = parent_table
        child.block_hashes = list(parent.block_hashes)
        child.num_registered_blocks = parent.num_registered_blocks
        child.num_computed_tokens = parent.num_computed_tokens

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks holding ``seq``'s first ``num_tokens`` positions: the
        blocks of rejected speculative tokens go back, tail first (they were never
        registered: only computed, accepted tokens are)."""
        keep = self.blocks_for(num_tokens)
        assert keep >= seq.num_registered_blocks, "truncating into registered blocks"
        for table in self.tables(seq):
            while len(table) > keep:
                block_id = table.pop()
                if block_id != NO_BLOCK:
                    self._release(block_id)

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks, tail first, so the tail is evicted before the prefix
        that other conversations are likelier to share."""
        for table in self.tables(seq):
            for block_id in reversed(table):
                if block_id != NO_BLOCK:
                    self._release(block_id)
            table.clear()
        seq.block_table = []
        seq.group_tables = []

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
                    tier_hash(block.hash, block.group),  # type: ignore[arg-type]
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
        del self._hash_maps[block.group][block.hash]  # type: ignore[arg-type]
        block.hash, block.token_ids, block.parent_hash, block.namespace, block.group = None, (), 0, 0, 0

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
