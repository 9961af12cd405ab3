"""What a layer asks of the LoRA adapters attached to it (``inference.lora`` implements
these): the layers stay free of the adapters' code, which builds on them."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class AttentionAdapters(Protocol):
    @property
    def active(self) -> bool: ...  # the step has rows of some adapter

    def add_qkv(self, hidden: torch.Tensor, qkv: torch.Tensor, sizes: tuple[int, int, int]) -> None: ...

    def add_o(self, x: torch.Tensor, out: torch.Tensor) -> None: ...


class MlpAdapters(Protocol):
    @property
    def active(self) -> bool: ...

    def forward(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor: ...
