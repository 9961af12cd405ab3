"""Prefill workers on GPUs: which device each process uses, and the staging slots that
blocks travel through (the design in docs/prefill-decode.md; not wired into the
engine yet, which moves blocks through shared memory on one machine's CPU).

- **Devices** (``plan_devices``): the engine keeps its device; the workers take the
  other visible devices, one each, round robin when there are more workers than
  devices left; with a single device they share it with the engine (MPS or time
  slicing: the split then buys only the scheduling, not compute).
- **Staging slots** (``SlotRing``): each worker allocates, once, a buffer of
  ``num_slots`` slots of ``max_blocks`` blocks on its own device and exports it to the
  engine once (a CUDA IPC handle through ``torch.multiprocessing``; on CPU the same call
  shares memory, which is how the bookkeeping is tested here). For a finished prompt the
  worker takes a free slot, copies the prompt's blocks into it, records a CUDA event
  (also exported), and sends (slot, blocks, event). The engine waits for the event on
  its own stream, copies the slot into its pool blocks (a peer-to-peer copy over
  NVLink/PCIe), records its own event, and returns the slot once that copy finished.
  A worker with no free slot holds its finished prompts: backpressure, the same as a
  full job queue. With NCCL instead, the slot is sent with ``send``/``recv`` between
  the worker's and the engine's ranks; the slot bookkeeping is the same.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def plan_devices(num_workers: int, device_count: int, engine_device: int = 0) -> list[int]:
    """The CUDA device index of each worker."""
    if num_workers <= 0:
        return []
    if device_count <= 0:
        raise ValueError("no CUDA device to place prefill workers on")
    if not 0 <= engine_device < device_count:
        raise ValueError(f"engine device {engine_device} is not one of {device_count} devices")
    others = [d for d in range(device_count) if d != engine_device] or [engine_device]
    return [others[i % len(others)] for i in range(num_workers)]


@dataclass
class SlotRing:
    """A worker's staging slots: free, filled (sent, the engine copying), returned."""

    num_slots: int
    max_blocks: int
    _free: deque[int] = field(init=False)
    _busy: dict[int, str] = field(init=False, default_factory=dict)  # slot -> request id

    def __post_init__(self) -> None:
        if self.num_slots < 1 or self.max_blocks < 1:
            raise ValueError("a slot ring needs at least one slot of one block")
        self._free = deque(range(self.num_slots))

    @property
    def free(self) -> int:
        return len(self._free)

    def slots_for(self, num_blocks: int) -> int:
        """Slots a prompt of ``num_blocks`` blocks needs (a long prompt spans several)."""
        return -(-num_blocks // self.max_blocks) if num_blocks else 0

    def take(self, request_id: str, num_blocks: int) -> list[int] | None:
        """Slots for a finished prompt, or None (wait: the engine still copies others)."""
        need = self.slots_for(num_blocks)
        if need > self.num_slots:
            raise ValueError(f"{num_blocks} blocks never fit {self.num_slots} slots of {self.max_blocks}")
        if need > len(self._free):
            return None
        slots = [self._free.popleft() for _ in range(need)]
        for slot in slots:
            self._busy[slot] = request_id
        return slots

    def give_back(self, slots: list[int]) -> None:
        """The engine's copy out of ``slots`` finished (or the request was dropped)."""
        if len(set(slots)) != len(slots) or any(s not in self._busy for s in slots):
            raise ValueError(f"slots {slots} were not all taken")  # checked first: no half-done return
        for slot in slots:
            del self._busy[slot]
            self._free.append(slot)

    def drop_request(self, request_id: str) -> list[int]:
        """Free the slots of a request the engine will never copy (aborted, engine gone)."""
        slots = [s for s, rid in self._busy.items() if rid == request_id]
        self.give_back(slots)
        return slots
