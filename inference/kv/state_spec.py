"""What one sequence's recurrent state costs, declared by a hybrid model class.

A linear-attention (Gated DeltaNet) or other recurrent layer keeps a fixed-size state
per sequence instead of a growing KV cache: a short convolution's last inputs and the
recurrent matrix. The engine keeps these in a pool of *state slots*, one slot per
running sequence (and per saved prefix state), with the same accounting as KV blocks.
Full-attention layers of the same model keep using the paged KV pool (``KVSpec``).

    conv pool of recurrent layer k:  [num_slots, *conv_shape]
    ssm pool of recurrent layer k:   [num_slots, *ssm_shape]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference.layers.recurrent_context import RecurrentStates


@dataclass(frozen=True)
class RecurrentLayerSpec:
    """One recurrent layer: its index among the model's decoder layers and the
    per-sequence shapes of its two states."""

    layer: int
    conv_shape: tuple[int, ...]
    ssm_shape: tuple[int, ...]


@dataclass(frozen=True)
class RecurrentSpec:
    layers: tuple[RecurrentLayerSpec, ...]
    conv_dtype: torch.dtype = torch.float32
    # The recurrent matrix accumulates over the whole history: kept in fp32.
    ssm_dtype: torch.dtype = torch.float32

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def bytes_per_state(self) -> int:
        """Bytes one slot costs across every recurrent layer."""
        conv = sum(math.prod(spec.conv_shape) for spec in self.layers) * _itemsize(self.conv_dtype)
        ssm = sum(math.prod(spec.ssm_shape) for spec in self.layers) * _itemsize(self.ssm_dtype)
        return conv + ssm

    def allocate(self, num_slots: int, device: torch.device | str = "cpu") -> RecurrentStates:
        return RecurrentStates(
            conv=[
                torch.zeros(num_slots, *s.conv_shape, dtype=self.conv_dtype, device=device)
                for s in self.layers
            ],
            ssm=[
                torch.zeros(num_slots, *s.ssm_shape, dtype=self.ssm_dtype, device=device) for s in self.layers
            ],
        )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
