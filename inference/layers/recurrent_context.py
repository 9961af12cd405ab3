"""Per-step metadata that tells a recurrent layer which state slot each sequence uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RecurrentStates:
    """The state pool: per recurrent layer (in ``RecurrentSpec.layers`` order) a conv
    tensor ``[num_slots, *conv_shape]`` and a recurrent tensor ``[num_slots, *ssm_shape]``."""

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]

    @property
    def num_slots(self) -> int:
        return self.conv[0].shape[0] if self.conv else 0

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy one slot's states into another (fork, save, restore)."""
        for tensors in (self.conv, self.ssm):
            for t in tensors:
                t[dst].copy_(t[src])


@dataclass
class RecurrentContext:
    """Built by the model runner once per step (``AttentionContext.recurrent``).

    ``B`` is the number of sequences in the step, in the same order as
    ``AttentionContext.query_start_loc``. A recurrent layer reads sequence ``i``'s state
    from slot ``state_slots[i]`` (zeros instead when ``has_initial_state[i]`` is False)
    and writes the state after the step's last token of that sequence back to the same
    slot, in place.

    ``query_start_loc`` (None: the attention's) packs the recurrent layers' spans when
    they differ from the attention's rows: a speculative verification runs its ``k + 1``
    positions as ``k + 1`` decode rows for attention but as one span of ``k + 1`` tokens
    for the recurrent layers (each position continues from the one before it). ``B`` then
    counts those spans.
    """

    state_slots: torch.Tensor  # [B] int64
    has_initial_state: torch.Tensor  # [B] bool
    states: RecurrentStates
    query_start_loc: torch.Tensor | None = None  # [B + 1] int32
