"""What one token costs in the KV pool, declared by the model class.

The engine sizes the pool, the block bytes, copy-on-write copies and the prefix
cache from a ``KVSpec`` alone; the block manager and the scheduler only ever see
block ids. The pool stays block-first, ``pool[b]`` is one page (one contiguous unit
that copy-on-write and the KV tiers move whole):

    pool: [num_blocks, planes, layers_per_block, block_size, *token_shape]

- Llama family: ``planes = 2`` (K and V), ``token_shape = (kv_heads, head_dim)``;
  ``pool[:, 0, slot]`` is one layer's K cache ``[num_blocks, block_size, Hkv, D]``.
- MLA (DeepSeek): ``planes = 1``, ``token_shape = (kv_lora_rank + qk_rope_head_dim,)``:
  one compressed latent per token per layer, shared by every head.

**KV groups (sliding windows).** ``windows`` gives each layer's attention window (None:
full attention). Layers with the same window are cut into groups of
``layers_per_block`` layers (the smallest window class's size, so every page is the same
size and one pool serves them all; a class that does not divide evenly ends in a shorter
group, whose pages leave a slot unused), each group with its own block table per
sequence: Gemma 3's 29 sliding and 5 full layers make 7 groups of 5, not 34 of 1. A model whose layers all attend alike has one group holding every layer, so
``pool[b]`` is then one block of every layer, as before. A sliding group's table keeps
only the blocks its window still reaches (``inference.kv.block_manager``), which is
where a sliding model saves memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class KVGroup:
    """Layers sharing one block table: their window (None = full attention) and ids."""

    window: int | None
    layers: tuple[int, ...]


@dataclass(frozen=True)
class KVSpec:
    num_layers: int
    planes: int  # tensors cached per token and layer: 2 (K, V) or 1 (a latent)
    token_shape: tuple[int, ...]  # one plane's entry for one token in one layer
    windows: tuple[int | None, ...] | None = None  # per layer; None = all full attention

    def __post_init__(self) -> None:
        if self.windows is not None:
            if len(self.windows) != self.num_layers:
                raise ValueError(f"{len(self.windows)} windows for {self.num_layers} layers")
            if any(w is not None and w < 1 for w in self.windows):
                raise ValueError(f"windows must be positive: {self.windows}")

    def window_of(self, layer: int) -> int | None:
        return None if self.windows is None else self.windows[layer]

    @cached_property
    def groups(self) -> tuple[KVGroup, ...]:
        """The KV groups, full-attention ones first (then by window, widest first)."""
        classes: dict[int | None, list[int]] = {}
        for layer in range(self.num_layers):
            classes.setdefault(self.window_of(layer), []).append(layer)
        if not classes:  # a model without layers still has one (empty) group
            return (KVGroup(None, ()),)
        size = min(len(layers) for layers in classes.values())
        order = sorted(classes, key=lambda w: (w is not None, -(w or 0)))
        return tuple(
            KVGroup(w, tuple(classes[w][i : i + size]))
            for w in order
            for i in range(0, len(classes[w]), size)
        )

    @property
    def layers_per_block(self) -> int:
        return len(self.groups[0].layers) if self.num_layers else 0

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def is_hybrid(self) -> bool:
        """Some layer has a window: block tables are per group and sliding ones shrink."""
        return any(g.window is not None for g in self.groups)

    @cached_property
    def layer_slots(self) -> tuple[tuple[int, int], ...]:
        """``(group, slot)`` of each layer: its cache is ``pool[:, plane, slot]`` addressed
        through that group's block table."""
        where = {layer: (g, s) for g, group in enumerate(self.groups) for s, layer in enumerate(group.layers)}
        return tuple(where[layer] for layer in range(self.num_layers))

    def block_shape(self, block_size: int) -> tuple[int, ...]:
        """The shape of ``pool[b]``."""
        return (self.planes, self.layers_per_block, block_size, *self.token_shape)

    @property
    def elements_per_token_per_layer(self) -> int:
        return self.planes * math.prod(self.token_shape)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Pool bytes one token costs in one block (all layers of one group)."""
        return self.layers_per_block * self.elements_per_token_per_layer * _itemsize(dtype)

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)

    def allocate(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        return torch.zeros(num_blocks, *self.block_shape(block_size), dtype=dtype, device=device)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
