"""Saved recurrent states below the state pool: host memory and disk, like KV blocks.

    state pool (device) -> host (RAM; under a CUDA pool only) -> disk (files; any device)

A saved state (``inference.kv.saved_states``) is keyed by the chained hash of the block
that ends its prefix, with the exact prefix tokens and the salt namespace of that block.
Every tier checks all three before serving a state, so a hash collision or another
user's state is never served.

- **Disk.** A ``DiskTier`` of its own in ``<kv_disk_dir>/states``: one file per state,
  its payload the slot's tensors as raw bytes (conv per layer, then ssm per layer). Its
  fingerprint is the KV blocks' (weights, tokenizer, layout) plus the recurrent layout,
  so a restart with other weights empties it, and every file's header carries the digest
  (another model's file under the same hash is a miss). Size bound, LRU, namespace
  directories and purges are the disk tier's own.
- **Writes.** A state saved at a prompt's save point is written through at once (queued;
  dropped when the queue is full), so states still in the pool at shutdown survive a
  restart; an answer's final state is written when its sequence is freed (the decode
  boundaries before it are replaced and never written). A state evicted from the pool
  goes to the host tier, or to disk without one; a retained one (an open conversation's)
  is written with ``force``. The host tier's own evictions go to disk.
- **Reads** are synchronous: a state is one slot's worth of bytes, read once when a
  prompt is admitted, and it is installed in the pool (``SavedStates.add_restored``) so
  the prefix-hit path then serves it like any saved state.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.kv.disk import DiskTier
from inference.kv.identity import is_block
from inference.kv.saved_states import SavedState
from inference.kv.state_pool import StatePool

logger = logging.getLogger(__name__)

STATES_DIR = "states"  # under the KV disk directory; not a namespace name, so the KV tier skips it


@dataclass(slots=True)
class HostState:
    parent: int  # always 0: a state's identity is its tokens (``is_block``'s fields)
    tokens: tuple[int, ...]
    namespace: int
    data: torch.Tensor  # the packed slot (``StateLayout.pack``)


class StateLayout:
    """A slot's tensors as one flat byte tensor and back."""

    def __init__(self, pool: StatePool) -> None:
        tensors = (*pool.states.conv, *pool.states.ssm)
        self.shapes = [tuple(t.shape[1:]) for t in tensors]
        self.dtypes = [t.dtype for t in tensors]
        self.sizes = [math.prod(s) * t.element_size() for s, t in zip(self.shapes, tensors, strict=True)]
        self.num_bytes = sum(self.sizes)

    def pack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])

    def unpack(self, data: torch.Tensor) -> list[torch.Tensor]:
        parts = torch.split(data.reshape(-1), self.sizes)
        return [p.view(d).view(s) for p, d, s in zip(parts, self.dtypes, self.shapes, strict=True)]

    def describe(self) -> dict[str, list]:
        return {"shapes": [list(s) for s in self.shapes], "dtypes": [str(d) for d in self.dtypes]}


class HostStates:
    """Packed states in RAM, least recently used first; retained ones evicted last."""

    def __init__(
        self,
        capacity_bytes: int,
        state_bytes: int,
        *,
        is_retained: Callable[[int], bool] = lambda _: False,
        on_evict: Callable[[int, HostState], None] | None = None,
    ) -> None:
        self.max_states = capacity_bytes // max(1, state_bytes)
        self.is_retained = is_retained
        self.on_evict = on_evict
        self._entries: OrderedDict[int, HostState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: int, tokens: tuple[int, ...], namespace: int) -> HostState | None:
        entry = self._entries.get(key)
        if not is_block(entry, 0, tokens, namespace):
            return None
        self._entries.move_to_end(key)
        return entry

    def store(self, key: int, tokens: tuple[int, ...], namespace: int, data: torch.Tensor) -> bool:
        if self.max_states <= 0:
            return False
        self._entries.pop(key, None)
        while len(self._entries) >= self.max_states:
            victim = next((k for k in self._entries if not self.is_retained(k)), next(iter(self._entries)))
            entry = self._entries.pop(victim)
            if self.on_evict is not None:
                self.on_evict(victim, entry)
        self._entries[key] = HostState(0, tokens, namespace, data)
        return True

    def purge_namespace(self, namespace: int) -> int:
        victims = [k for k, e in self._entries.items() if e.namespace == namespace]
        for key in victims:
            del self._entries[key]
        return len(victims)


class StateTiers:
    def __init__(
        self, pool: StatePool, *, host: HostStates | None = None, disk: DiskTier | None = None
    ) -> None:
        self.pool = pool
        self.layout = StateLayout(pool)
        self.host = host
        self.disk = disk if disk is not None and disk.enabled else None
        if self.host is not None:
            self.host.on_evict = self._host_evicted
        self.num_restored = 0

    @property
    def enabled(self) -> bool:
        return self.host is not None or self.disk is not None

    def _read_slot(self, slot: int) -> torch.Tensor:
        return self.layout.pack(self.pool.read(slot))

    # ---- writes ----------------------------------------------------------------------------
    def saved(self, entry: SavedState) -> None:
        """A state just saved in the pool: written through to disk (queued, may be dropped)."""
        if self.disk is not None and not self.disk.contains(entry.key):
            self.disk.write(
                entry.key, 0, entry.tokens, self._read_slot(entry.slot), namespace=entry.namespace
            )

    def evicted(self, entry: SavedState, *, retained: bool) -> None:
        """A saved state leaving the pool: to the host tier, else to disk (forced if retained)."""
        if self.host is not None:
            self.host.store(entry.key, entry.tokens, entry.namespace, self._read_slot(entry.slot))
            return
        if self.disk is not None and not self.disk.contains(entry.key):
            data = self._read_slot(entry.slot)
            self.disk.write(entry.key, 0, entry.tokens, data, force=retained, namespace=entry.namespace)

    def _host_evicted(self, key: int, entry: HostState) -> None:
        if self.disk is not None and not self.disk.contains(key):
            force = self.disk.is_retained(key)
            self.disk.write(key, 0, entry.tokens, entry.data, force=force, namespace=entry.namespace)

    # ---- reads -----------------------------------------------------------------------------
    def find(self, key: int, tokens: tuple[int, ...], namespace: int) -> str | None:
        if self.host is not None and self.host.lookup(key, tokens, namespace) is not None:
            return "host"
        if self.disk is not None and self.disk.lookup(key, 0, tokens, namespace):
            return "disk"
        return None

    def restore(self, key: int, tokens: tuple[int, ...], namespace: int, slot: int) -> bool:
        """Write the state saved after exactly ``tokens`` into ``slot``; False when no tier
        can serve it (missing, corrupt, another model's)."""
        data: torch.Tensor | None = None
        if self.host is not None and (entry := self.host.lookup(key, tokens, namespace)) is not None:
            data = entry.data
        elif self.disk is not None:
            data = self.disk.read(key, 0, tokens, namespace)
        if data is None or data.numel() != self.layout.num_bytes:
            return False
        self.pool.write(slot, self.layout.unpack(data))
        self.num_restored += 1
        return True

    # ---- purge, life cycle -----------------------------------------------------------------
    def purge_namespace(self, namespace: int) -> None:
        if self.host is not None:
            self.host.purge_namespace(namespace)
        if self.disk is not None:
            self.disk.purge_namespace(namespace)

    def flush(self) -> None:
        if self.disk is not None:
            self.disk.flush()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def stats(self) -> dict[str, float]:
        return {
            "host_states": len(self.host) if self.host is not None else 0,
            "disk_states": len(self.disk) if self.disk is not None else 0,
            "restored_states": self.num_restored,
        }


def build_state_tiers(
    pool: StatePool,
    *,
    fingerprint: dict | None,
    host_bytes: int,
    kv_disk_dir: str | None,
    disk_bytes: int,
    is_retained: Callable[[int], bool],
) -> StateTiers | None:
    """The state tiers a configuration asks for (None = the pool alone): host memory under
    a CUDA pool (``host_bytes``), disk when the KV blocks have a disk directory."""
    layout = StateLayout(pool)
    host = None
    if pool.states.ssm and pool.states.ssm[0].device.type == "cuda" and host_bytes > 0:
        host = HostStates(host_bytes, layout.num_bytes, is_retained=is_retained)
    disk = None
    if kv_disk_dir:
        disk = DiskTier(
            Path(kv_disk_dir) / STATES_DIR,
            disk_bytes,
            (layout.num_bytes,),
            torch.uint8,
            {**(fingerprint or {}), "recurrent": layout.describe()},
            is_retained=is_retained,
        )
    tiers = StateTiers(pool, host=host, disk=disk)
    return tiers if tiers.enabled else None
