"""The resident adapters' layout: projection groups, and each group's stacked A and B
(S-LoRA's unified layout: slot ``s`` of every stack is one adapter, zero-padded to the
largest rank), and what the layers read of the manager that holds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

# Projection groups: the projections of one group share their input, so one shrink serves them.
GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


@dataclass
class Stack:
    """One group's resident adapters: A ``[S, len(group) * max_rank, in]`` (the group's A
    matrices one under the other) and per projection B ``[S, out, max_rank]``."""

    a: torch.Tensor
    b: list[torch.Tensor]


class AdapterSlots(Protocol):
    """The manager's state the layers read during a step."""

    stacks: list[dict[str, Stack]]
    active: torch.Tensor | None  # each row's slot (-1: the base), while a step runs
    scales: torch.Tensor
    max_rank: int
