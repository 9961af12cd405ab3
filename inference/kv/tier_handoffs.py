"""The pool's hand-offs to the tiers below it, part of ``BlockManager``: a block computed
elsewhere (a prefill worker) imported as cached, a prefix lookup continued below the pool,
the loads that copy those blocks back in, and a preempted sequence's swap-out."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from inference.engine.sequence import Sequence
from inference.kv.blocks import PrefixBlocks
from inference.kv.pool_block import Block, block_namespace, tier_hash

if TYPE_CHECKING:
    from inference.kv.tiers import TierStack


class TierHandoffs:
    """Mixed into ``BlockManager``: these methods use its pool, hash maps and prefix lookup."""

    blocks: list[Block]
    block_size: int
    enable_prefix_caching: bool
    tiers: TierStack | None
    _hash_maps: list[dict[int, int]]

    num_groups: int
    num_free_blocks: int

    def import_block(
        self,
        block_hash: int,
        parent: int,
        tokens: tuple[int, ...],
        namespace: int,
        fill: Callable[[int], None],
        group: int = 0,
    ) -> bool:
        """Register a block computed elsewhere (a prefill worker) as cached and free, as if
        a finished sequence had left it: ``fill(block_id)`` writes its K/V into the pool
        first. False (nothing changed) when that hash is cached already or no block is free."""
        by_hash = self._hash_maps[group]
        if not self.enable_prefix_caching or block_hash in by_hash or not self.num_free_blocks:
            return False
        block_id = self._allocate()
        fill(block_id)
        block = self.blocks[block_id]
        block.hash, block.parent_hash, block.token_ids, block.namespace, block.group = (
            block_hash,
            parent,
            tokens,
            namespace,
            group,
        )
        by_hash[block_hash] = block_id
        if self.tiers is not None:
            self.tiers.block_cached(tier_hash(block_hash, group), parent, tokens, block_id, namespace)
        self._release(block_id)
        return True

    def match_lower(self, seq: Sequence, start: int) -> list[str]:
        """The tiers holding ``seq``'s blocks ``start, start + 1, ...`` (the hash chain
        continued below the pool), up to the first block no tier has; same rule as
        ``match_prefix`` about the last token. With several KV groups, one entry per
        group of each block (block-major), and a block counts only when every group's
        copy is below the pool."""
        if self.tiers is None or not self.enable_prefix_caching or seq.score_prompt:
            return []  # a prompt being scored runs every token (see match_prefix)
        bs = self.block_size
        found: list[str] = []
        hashes = self._hashes(seq, (seq.num_tokens - 1) // bs)
        for i in range(start, len(hashes)):
            if any(hashes[i] in by_hash for by_hash in self._hash_maps):
                break  # in the pool after all (a later admission will revive it)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            parent, namespace = self._parent_hash(seq, i), block_namespace(seq, i)
            tiers = [
                self.tiers.find(tier_hash(hashes[i], g), parent, tokens, namespace)
                for g in range(self.num_groups)
            ]
            if any(t is None for t in tiers):
                break
            found.extend(tiers)  # type: ignore[arg-type]
        return found

    def prefix_to_load(self, seq: Sequence) -> PrefixBlocks | None:
        """``seq``'s cached prefix when it continues in a lower tier and the tiers' cost model
        says reading those blocks beats recomputing them; None otherwise."""
        if self.tiers is None:
            return None
        hits = self.match_prefix(seq)
        lower = self.match_lower(seq, len(hits))
        num_tokens = len(lower) // self.num_groups * self.block_size
        if not lower or not self.tiers.worth_loading(lower, num_tokens):
            return None
        return PrefixBlocks(tuple(hits), tuple(lower), self.num_revived(hits, seq))

    def swap_out(self, seq: Sequence) -> bool:
        """``seq`` is preempted: True when the tiers took its cached blocks (a swap; a lookup
        finds them at re-admission), False when it is to be recomputed (the tiers' call)."""
        return self.tiers is not None and self.tiers.swap_out(
            self.registered_blocks(seq), seq.num_computed_tokens
        )

    def start_loads(self, seq: Sequence, tiers: Collection[str]) -> None:
        """Fresh pool blocks for the next ``len(tiers) / num_groups`` blocks of ``seq``
        (admitted with its pool hits) in every group, each filled from its tier;
        ``complete_loads`` finishes them."""
        assert self.tiers is not None and len(seq.block_table) * self.block_size == seq.num_computed_tokens
        bs, start, groups = self.block_size, len(seq.block_table), self.tables(seq)
        names = list(tiers)
        for n in range(len(names) // self.num_groups):
            i = start + n
            parent = self._parent_hash(seq, i)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            for g, table in enumerate(groups):
                block_id = self._allocate()
                table.append(block_id)
                seq.pending_loads.append(
                    self.tiers.start_load(
                        names[n * self.num_groups + g],
                        tier_hash(seq.block_hashes[i], g),
                        parent,
                        tokens,
                        block_id,
                        block_namespace(seq, i),
                    )
                )

    def loads_done(self, seq: Sequence) -> bool:
        return all(load.done() for load in seq.pending_loads)

    def complete_loads(self, seq: Sequence, count_hits: bool = True) -> int:
        """Copy the finished reads into the pool and count the served blocks as computed
        (registered in the prefix cache); stops at the first block that could not be
        served (in any group), whose tokens are then recomputed. Returns the tokens served."""
        assert self.tiers is not None
        served = 0
        loads = seq.pending_loads
        for n in range(0, len(loads), self.num_groups):
            block_loads = loads[n : n + self.num_groups]
            # Every read is finished (copied in or failed) whatever happened before it.
            ok = [self.tiers.finish_load(load) for load in block_loads]
            if not all(ok) or served < n // self.num_groups * self.block_size:
                continue
            if count_hits:  # a first admission's prefix hit (not a swap-in)
                self.tiers.counters.hit_tokens[block_loads[0].tier] += self.block_size
            self.tiers.counters.loaded_blocks += len(block_loads)
            served += self.block_size
        seq.pending_loads = []
        seq.num_computed_tokens += served
        self.register_full_blocks(seq)
        return served
