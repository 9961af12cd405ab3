"""Per-step metadata that tells attention where each sequence's KV lives."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.layers.recurrent_context import RecurrentContext


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
    # KV groups 1.. of a sliding-window model (``inference.kv.spec``): their own slot
    # mappings and block tables, the rest shared. Empty for a model with one group.
    group_contexts: list[AttentionContext] = field(default_factory=list)
    # Recurrent (linear-attention) layers of a hybrid model: each sequence's state slot.
    # None for a model without recurrent layers.
    recurrent: RecurrentContext | None = None
    # CPU: attention products of many rows may run in bf16 (``inference.layers.cpu_matmul``).
    cpu_bf16: bool = False

    # (rows to keep or None, block ids, offsets) of slot_mapping: the same for every layer.
    _store_index: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def for_group(self, group: int) -> AttentionContext:
        """The context of KV group ``group`` (this one for group 0)."""
        return self.group_contexts[group - 1] if group else self

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    def store_index(self, block_size: int) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Where each new token's K/V goes, split into (block, offset), computed once per
        step rather than once per layer; the first item selects the tokens to store
        (None = all of them: no slot is -1). Assumes ``slot_mapping`` is not edited in
        place afterwards (CUDA graphs' static inputs are, and never come here)."""
        if self._store_index is None:
            slots = self.slot_mapping
            keep: torch.Tensor | None = None
            if slots.numel() and bool((slots < 0).any()):
                keep = slots >= 0
                slots = slots[keep]
            slots = slots.long()
            self._store_index = (keep, slots // block_size, slots % block_size)
        return self._store_index
