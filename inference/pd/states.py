"""A hybrid model's recurrent state across the PD hand-off.

The KV blocks a worker ships serve only the full-attention layers; the recurrent
layers need their state after exactly those tokens. The worker's hybrid block manager
saved it while prefilling (the prompt's save point before its last token,
``HybridBlockManager.save_points``, is where the shipped blocks end); ``export_state``
packs that saved state (every recurrent layer's conv and recurrent tensors,
``StateLayout``) into a shared-memory segment of its own. ``import_state`` installs it
among the engine's saved states under the last shipped block's hash, so the request's
admission is an ordinary hybrid prefix hit (``HybridBlockManager.match_prefix`` serves
blocks only as far as a saved state). A plain model ships no state; a hybrid result
without one still imports its blocks, and the hit is then cut back to the longest prefix
with a saved state (the prompt is prefilled here).
"""

from __future__ import annotations

import torch

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager, block_namespace
from inference.kv.hybrid_blocks import HybridBlockManager
from inference.kv.state_tiers import StateLayout
from inference.pd.messages import PrefillDone
from inference.pd.transfer import MappedBlocks, discard, write_blocks


class StateMissing(Exception):
    """The worker's saved state for the shipped blocks is gone (evicted in a tiny pool)."""


def export_state(bm: BlockManager, hashes: list[int], tokens: list[int]) -> tuple[str | None, int]:
    """(segment name, bytes) of the state after ``tokens`` (the shipped blocks, whose last
    chained hash is ``hashes[-1]``); (None, 0) for a plain model or no blocks."""
    if not isinstance(bm, HybridBlockManager) or not hashes:
        return None, 0
    entry = bm.saved.lookup(hashes[-1], tokens)
    if entry is None:
        raise StateMissing("the worker's state pool no longer holds the prompt's recurrent state")
    data = StateLayout(bm.states).pack(bm.states.read(entry.slot))
    return write_blocks(data)


def import_state(bm: BlockManager, hashes: list[int], seq: Sequence, result: PrefillDone) -> bool:
    """Install ``result``'s state (if any) as the saved state after ``seq``'s first
    ``len(hashes)`` blocks; the segment is unlinked either way. False when none was
    installed."""
    name = result.state_shm_name
    if name is None:
        return False
    if not isinstance(bm, HybridBlockManager) or not hashes or bm.saved.max_saved <= 0:
        discard(name)
        return False
    layout = StateLayout(bm.states)
    if result.state_nbytes != layout.num_bytes:
        discard(name)  # another layout: not this model's state
        return False
    mapped = MappedBlocks(name, 1, (layout.num_bytes,), torch.uint8)
    try:
        slot = bm.states.allocate()
        while slot is None and bm.saved.evict_one():
            slot = bm.states.allocate()
        if slot is None:
            return False
        bm.states.write(slot, layout.unpack(mapped.blocks[0]))
    finally:
        mapped.close()
    k = len(hashes)
    tokens = tuple(seq.token_ids[: k * bm.block_size])
    bm.saved.add_restored(hashes[-1], tokens, slot, block_namespace(seq, k - 1))
    return True
