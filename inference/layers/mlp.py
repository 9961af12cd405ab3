"""SwiGLU MLP: ``down(silu(gate(x)) * up(x))``, with gate and up fused into one CPU
kernel call where the weights allow it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from chatsite_kernels.cpu import linear as cpu_linear
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import PackedQuant, QuantRows
from inference.layers.bf16_weights import Bf16Weight
from inference.layers.linear import (
    Linear,
    gate_up_released,
    packable,
    quant_linear,
    unpanel_gate_up,
    weight_key,
)
from inference.model_config import ModelConfig

if TYPE_CHECKING:
    from inference.layers.adapters import MlpAdapters


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). On the CPU in fp32 (without biases) gate,
    up and the SiLU product are one fused kernel call over interleaved packed weights."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple[tuple[int, int], tuple[int, int]] | None = None
    _gate_up_quant: PackedQuant | None = None  # gate and up rows interleaved 8 by 8
    lora: MlpAdapters | None = None  # LoRA adapters' products (inference.lora), when served
    _gate_up_bf16: Bf16Weight | None = None  # [gate; up] stacked, for many-row products

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        inter = intermediate_size or config.intermediate_size
        self.gate_proj = Linear(hidden, inter, bias=bias)
        self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None and self.lora.active:
            return self.lora.forward(self, x)
        gate, up = self.gate_proj, self.up_proj
        if self._gate_up_bf16 is not None and self._gate_up_bf16.serves(x):
            hidden = self._gate_up_bf16.silu_gate_up(x)
        elif self._gate_up_quant is not None:
            hidden = quant_linear(x, self._gate_up_quant, None, silu_pairs=True)
        elif gate.weight is None and self._packed is not None:  # released after packing
            hidden = gate_up_released(x, self._packed, gate.out_features)
        elif gate.bias is None and up.bias is None and cpu_linear.supports(x, gate.weight, None):
            hidden = cpu_linear.gate_up_silu(x, self.packed_gate_up(), gate.out_features)
        else:
            hidden = F.silu(gate(x)) * up(x)
        return self.down_proj(hidden)

    def prepare_packed(self) -> None:
        gate, up = self.gate_proj, self.up_proj
        if gate.bias is None and up.bias is None and packable(gate.weight) and packable(up.weight):
            self.packed_gate_up()
        self.down_proj.prepare_packed()

    def prepare_bf16(self, min_rows: int | None) -> int:
        """bf16 copies for many-row products: gate and up stacked into one where they are
        fused (quantized or packed), else each projection's own (None: drop them); returns
        their bytes."""
        self._gate_up_bf16 = None
        total = self.down_proj.prepare_bf16(min_rows)
        weight = self.fused_gate_up_weight() if min_rows is not None else None
        if weight is None or weight.device.type != "cpu":
            return total + self.gate_proj.prepare_bf16(min_rows) + self.up_proj.prepare_bf16(min_rows)
        self._gate_up_bf16 = Bf16Weight.of(weight, None, min_rows)
        return total + self._gate_up_bf16.nbytes

    def fused_gate_up_weight(self) -> torch.Tensor | None:
        """``[gate; up]`` fp32 ``[2N, K]`` where the two are fused (quantized or packed), else None."""
        gate, up, n = self.gate_proj, self.up_proj, self.gate_proj.out_features
        if self._gate_up_quant is not None:  # rows interleaved 8 gate, 8 up
            return self._gate_up_quant.dequantize().view(n // 8, 2, 8, -1).transpose(0, 1).reshape(2 * n, -1)
        if self._packed is None:
            return None
        if gate.weight is None or up.weight is None:  # released after packing
            return torch.cat(unpanel_gate_up(self._packed, n))
        return torch.cat([gate.weight, up.weight])

    def release_weights(self) -> None:
        if self._packed is not None:
            self.gate_proj.weight = self.up_proj.weight = None
        self.down_proj.release_weight()

    def set_quantized(self, rows: dict[str, QuantRows]) -> None:
        gate, up = rows.get("gate_proj"), rows.get("up_proj")
        fusable = self.gate_proj.bias is None and self.up_proj.bias is None
        if gate is not None and up is not None and gate.fmt == up.fmt and gate.shape[0] % 8 == 0 and fusable:
            self._gate_up_quant = cpu_quant.pack(cpu_quant.interleave_gate_up(gate, up))
            self.gate_proj.set_quantized(None)
            self.up_proj.set_quantized(None)
            rows = {n: r for n, r in rows.items() if n == "down_proj"}
        for name, r in rows.items():
            getattr(self, name).set_quantized(cpu_quant.pack(r))

    def packed_gate_up(self) -> torch.Tensor:
        if self.gate_proj.weight is None or self.up_proj.weight is None:
            return self._packed  # type: ignore[return-value]
        key = (weight_key(self.gate_proj.weight), weight_key(self.up_proj.weight))
        if self._packed is None or self._packed_key != key:
            self._packed = cpu_linear.pack_gate_up(self.gate_proj.weight, self.up_proj.weight)
            self._packed_key = key
        return self._packed
