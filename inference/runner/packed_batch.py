"""One step's model inputs, packed flat: what the model runner and the CUDA graphs share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.layers.attention_context import AttentionContext


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    ctx: AttentionContext
    sample_rows: torch.Tensor  # [N] rows of the hidden states whose logits are needed
    sampled: list[int]  # indices into batch.seqs of those N sequences
