"""What one token costs in the KV pool, declared by the model class.

The engine sizes the pool, the block bytes, copy-on-write copies and the prefix
cache from a ``KVSpec`` alone; the block manager and the scheduler only ever see
block ids. The pool stays block-first, ``pool[b]`` is one block for every layer
(one contiguous unit that copy-on-write and the KV tiers move whole):

    pool: [num_blocks, planes, num_layers, block_size, *token_shape]

- Llama family: ``planes = 2`` (K and V), ``token_shape = (kv_heads, head_dim)``;
  ``pool[:, 0, layer]`` is that layer's K cache ``[num_blocks, block_size, Hkv, D]``.
- MLA (DeepSeek): ``planes = 1``, ``token_shape = (kv_lora_rank + qk_rope_head_dim,)``:
  one compressed latent per token per layer, shared by every head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVSpec:
    num_layers: int
    planes: int  # tensors cached per token and layer: 2 (K, V) or 1 (a latent)
    token_shape: tuple[int, ...]  # one plane's entry for one token in one layer

    def block_shape(self, block_size: int) -> tuple[int, ...]:
        """The shape of ``pool[b]``."""
        return (self.planes, self.num_layers, block_size, *self.token_shape)

    @property
    def elements_per_token_per_layer(self) -> int:
        return self.planes * math.prod(self.token_shape)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Pool bytes one token costs over all layers."""
        return self.num_layers * self.elements_per_token_per_layer * _itemsize(dtype)

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)

    def allocate(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        return torch.zeros(num_blocks, *self.block_shape(block_size), dtype=dtype, device=device)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
