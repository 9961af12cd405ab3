"""The host-memory tier under a CUDA pool: whole blocks in pinned RAM, copied on a side stream.

- One slab ``[slots, *pool[b].shape]`` of page-locked memory, allocated once, so a
  device↔host copy is a DMA that can overlap compute. Slots are keyed by the chained
  block hash with the parent hash and tokens kept for the collision check; LRU order,
  unretained blocks evicted before retained ones.
- **Copies run on a side stream.** Offload (pool → slot): the side stream first waits
  for the compute stream (the block's K/V must be finished), then copies; the event
  recorded after it is what the next forward waits on (``before_forward``) before it
  may overwrite that pool block. Reload (slot → pool): copied on the side stream too,
  and the next forward waits for it likewise. The host thread never synchronises for
  either; only reading a slot on the host (for a disk write) waits for that slot's
  event.
- On a CPU pool the class works the same with plain copies (the engine does not use it
  there: the pool is already in RAM), which is how its bookkeeping is unit-tested.

Unmeasured on CUDA in this repository's CI (no GPU); correct by construction as above.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inference.kv.identity import is_block


@dataclass(slots=True)
class HostEntry:
    slot: int
    parent: int
    tokens: tuple[int, ...]
    namespace: int = 0  # the block's salt namespace (inference.kv.salt)


class HostTier:
    name = "host"

    def __init__(
        self,
        pool: torch.Tensor,
        capacity_bytes: int,
        *,
        is_retained: Callable[[int], bool] = lambda h: False,
        on_evict: Callable[[int, int, tuple[int, ...], torch.Tensor, int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.block_bytes = pool[0].numel() * pool.element_size()
        num_slots = int(capacity_bytes // self.block_bytes)
        self.cuda = pool.device.type == "cuda"
        self.slab = torch.empty((num_slots, *pool.shape[1:]), dtype=pool.dtype, pin_memory=self.cuda)
        self.is_retained = is_retained
        # Called with (hash, parent, tokens, host data, namespace) before a slot is reused.
        self.on_evict = on_evict
        self._index: OrderedDict[int, HostEntry] = OrderedDict()  # least recently used first
        self._free = list(range(num_slots - 1, -1, -1))
        self._slot_events: dict[int, Any] = {}  # slot -> event of the copy last writing it
        self._stream = torch.cuda.Stream(pool.device) if self.cuda else None
        self._waits: list[Any] = []  # events the next forward must wait for
        self.bytes_written = self.bytes_read = 0

    @property
    def num_slots(self) -> int:
        return self.slab.shape[0]

    @property
    def enabled(self) -> bool:
        return self.num_slots > 0

    def __len__(self) -> int:
        return len(self._index)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._index

    def lookup(self, block_hash: int, parent: int, tokens: tuple[int, ...], namespace: int = 0) -> bool:
        return is_block(self._index.get(block_hash), parent, tokens, namespace)

    def purge_namespace(self, namespace: int) -> int:
        """Drop ``namespace``'s blocks; their slots are free (and zeroed) at once."""
        victims = [h for h, entry in self._index.items() if entry.namespace == namespace]
        if victims and self._stream is not None:
            self._stream.synchronize()  # no copy may still read or write a slot being zeroed
        for block_hash in victims:
            slot = self._index.pop(block_hash).slot
            self._slot_events.pop(slot, None)
            self.slab[slot].zero_()
            self._free.append(slot)
        return len(victims)

    # ---- pool -> host ----------------------------------------------------------------------
    def store(
        self, block_hash: int, parent: int, tokens: tuple[int, ...], block_id: int, namespace: int = 0
    ) -> bool:
        """Copy ``pool[block_id]`` into a slot (evicting the LRU slot if none is free)."""
        if not self.enabled or block_hash in self._index:
            return False
        slot = self._free.pop() if self._free else self._evict_one()
        self._copy(self.slab[slot], self.pool[block_id], slot_written=slot)
        self._index[block_hash] = HostEntry(slot, parent, tokens, namespace)
        self.bytes_written += self.block_bytes
        return True

    def _evict_one(self) -> int:
        victim = next((h for h in self._index if not self.is_retained(h)), None)
        if victim is None:
            victim = next(iter(self._index))
        entry = self._index.pop(victim)
        if self.on_evict is not None:
            self.on_evict(victim, entry.parent, entry.tokens, self.host_block(entry.slot), entry.namespace)
        return entry.slot

    def host_block(self, slot: int) -> torch.Tensor:
        """A slot's data, safe to read on the host (waits for the copy that wrote it)."""
        event = self._slot_events.pop(slot, None)
        if event is not None:
            event.synchronize()
        return self.slab[slot]

    # ---- host -> pool ----------------------------------------------------------------------
    def load(self, block_hash: int, block_id: int) -> bool:
        """Start copying a slot into ``pool[block_id]``; the next forward waits for it."""
        entry = self._index.get(block_hash)
        if entry is None:
            return False
        self._index.move_to_end(block_hash)
        self._copy(self.pool[block_id], self.slab[entry.slot], slot_written=None)
        self.bytes_read += self.block_bytes
        return True

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, *, slot_written: int | None) -> None:
        if self._stream is None:
            dst.copy_(src)
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.pool.device))
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._waits.append(event)
        if slot_written is not None:
            self._slot_events[slot_written] = event

    def before_forward(self) -> None:
        """Make the compute stream wait (on the GPU, not the host) for this step's copies."""
        if self._stream is None:
            self._waits.clear()
            return
        current = torch.cuda.current_stream(self.pool.device)
        for event in self._waits:
            current.wait_event(event)
        self._waits.clear()

    def stats(self) -> dict[str, float]:
        return {
            "blocks": len(self._index),
            "capacity_blocks": self.num_slots,
            "bytes_written": self.bytes_written,
            "bytes_read": self.bytes_read,
        }
