"""The adapters' products inside a Llama-family layer, around the base weights' one product
for the whole batch: each projection's output gets ``scale * B (A x)`` of its row's adapter
(``inference.lora.ops``: one shrink per input shared by its projections, one expand per
projection). Attached to the layers' ``lora`` attribute by ``LoraManager``; they act only
while a step has rows of some adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import linear as cpu_linear
from inference.layers.linear import quant_linear
from inference.lora import ops

if TYPE_CHECKING:
    from inference.layers.mlp import MLP
    from inference.lora.stacks import AdapterSlots, Stack


class LayerLora:
    def __init__(self, manager: AdapterSlots, layer: int) -> None:
        self.manager = manager
        self.layer = layer

    @property
    def active(self) -> bool:
        return self.manager.active is not None

    def add(self, group: str, x: torch.Tensor, outs: list[torch.Tensor]) -> None:
        """Add the adapters' products of ``group`` (its projections share the input ``x``)
        to ``outs``, one output (or column slice of one) per projection, in place."""
        stack: Stack = self.manager.stacks[self.layer][group]
        slots, scales, rank = self.manager.active, self.manager.scales, self.manager.max_rank
        y = ops.shrink(x, stack.a, slots)
        for i, (b, out) in enumerate(zip(stack.b, outs, strict=True)):
            ops.expand(y[:, i * rank : (i + 1) * rank], b, slots, scales, out)


class AttentionLora(LayerLora):
    """q, k and v from one shrink; o from its own."""

    def add_qkv(self, hidden: torch.Tensor, qkv: torch.Tensor, sizes: tuple[int, int, int]) -> None:
        q, k, _v = sizes
        self.add("qkv", hidden, [qkv[:, :q], qkv[:, q : q + k], qkv[:, q + k :]])

    def add_o(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.add("o", x, [out])


class MlpLora(LayerLora):
    """gate and up need their adapters' products before the SiLU, so the fused SwiGLU
    kernel gives way to the plain gate/up product (the same panels, without the SiLU)."""

    def forward(self, mlp: MLP, x: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up_products(mlp, x)
        self.add("gate_up", x, [gate, up])
        hidden = F.silu(gate) * up
        out = mlp.down_proj(hidden)
        self.add("down", hidden, [out])
        return out


def _split_pairs(raw: torch.Tensor, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved 8 gate, 8 up outputs -> (gate, up), each ``[T, inter]`` contiguous."""
    pairs = raw.view(raw.shape[0], -1, 2, cpu_linear.GATE_UP_PANEL)
    gate = pairs[:, :, 0].reshape(raw.shape[0], -1)[:, :inter].contiguous()
    up = pairs[:, :, 1].reshape(raw.shape[0], -1)[:, :inter].contiguous()
    return gate, up


def gate_up_products(mlp: MLP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``gate(x)`` and ``up(x)`` from wherever the MLP keeps those weights: quantized
    interleaved blocks, packed interleaved panels (the fp32 originals released), or the
    projections themselves."""
    inter = mlp.gate_proj.out_features
    x2 = x.reshape(-1, x.shape[-1])
    if mlp._gate_up_quant is not None:
        return _split_pairs(quant_linear(x2, mlp._gate_up_quant, None, silu_pairs=False), inter)
    packed = mlp._packed
    if mlp.gate_proj.weight is None and packed is not None:
        if cpu_linear.available():  # the interleaved panels are plain 16-wide panels
            return _split_pairs(
                cpu_linear.linear_packed(x2, packed, packed.shape[0] * cpu_linear.PANEL), inter
            )
        half = cpu_linear.GATE_UP_PANEL
        gate_w = packed[:, :, :half].transpose(1, 2).reshape(-1, packed.shape[1])[:inter]
        up_w = packed[:, :, half:].transpose(1, 2).reshape(-1, packed.shape[1])[:inter]
        return F.linear(x2, gate_w), F.linear(x2, up_w)
    return mlp.gate_proj(x2), mlp.up_proj(x2)
