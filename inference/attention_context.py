"""Per-step metadata that tells attention where each sequence's KV lives."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionContext:
    """Built by the model runner once per step, read by every attention layer.

    All tensors live on the model's device. ``T`` is the number of packed new
    tokens in the step, ``B`` the number of sequences.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token, -1 = skip
    query_start_loc: torch.Tensor  # [B+1] int32: cumulative new-token counts
    context_lens: torch.Tensor  # [B] int32: cached + new tokens of each sequence
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    max_query_len: int  # 1 means a decode-only step
    max_context_len: int

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
