"""The pool of recurrent-state slots of a hybrid model, with the KV blocks' accounting.

One slot holds one sequence's state across every recurrent layer (``RecurrentSpec``).
A running sequence holds one slot; a saved prefix state (``inference.kv.saved_states``)
holds one too. Each slot has a reference count; a slot whose count drops to 0 goes back
to the free list. Copies (fork, save, restore) run at once on the pool's device: the
step that wrote the source has finished by then, and the next step that reads the
destination runs after the copy on the same stream.
"""

from __future__ import annotations

import torch

from inference.kv.state_spec import RecurrentSpec
from inference.layers.recurrent_context import RecurrentStates


class StatePool:
    def __init__(self, spec: RecurrentSpec, num_slots: int, device: torch.device | str = "cpu") -> None:
        assert num_slots >= 1
        self.spec = spec
        self.states: RecurrentStates = spec.allocate(num_slots, device)
        self.ref_counts = [0] * num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # a stack: reuse is order-free

    @property
    def num_slots(self) -> int:
        return len(self.ref_counts)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - self.num_free

    def allocate(self) -> int | None:
        """A free slot with count 1, or None when every slot is held."""
        if not self._free:
            return None
        slot = self._free.pop()
        self.ref_counts[slot] = 1
        return slot

    def take(self, slot: int) -> None:
        assert self.ref_counts[slot] > 0, f"slot {slot} is free"
        self.ref_counts[slot] += 1

    def release(self, slot: int) -> None:
        assert self.ref_counts[slot] > 0, f"slot {slot} released twice"
        self.ref_counts[slot] -= 1
        if self.ref_counts[slot] == 0:
            self._free.append(slot)

    @torch.inference_mode()
    def copy(self, src: int, dst: int) -> None:
        self.states.copy_slot(src, dst)

    def read(self, slot: int) -> list[torch.Tensor]:
        """One slot's tensors (conv per layer, then ssm per layer) on the host: what the
        lower tiers store."""
        return [t[slot].detach().to("cpu", copy=True) for t in (*self.states.conv, *self.states.ssm)]

    @torch.inference_mode()
    def write(self, slot: int, tensors: list[torch.Tensor]) -> None:
        """Install ``read``'s tensors into ``slot``."""
        pool = (*self.states.conv, *self.states.ssm)
        assert len(tensors) == len(pool)
        for dst, src in zip(pool, tensors, strict=True):
            dst[slot].copy_(src)


def num_state_slots(spec: RecurrentSpec, running: int, max_saved: int, budget_bytes: int) -> tuple[int, int]:
    """(total slots, of which saved prefix states may hold at most): one slot per running
    sequence, plus up to ``max_saved`` saved states within ``budget_bytes``."""
    per_state = max(1, spec.bytes_per_state())
    saved = max(0, min(max_saved, budget_bytes // per_state))
    return running + saved, saved
