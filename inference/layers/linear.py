"""Linear layers on the CPU kernels: ``Linear`` (an ``nn.Linear`` whose fp32 CPU products
go through ``chatsite_kernels.cpu.linear``, or hold a quantized weight for ``chatsite_kernels.cpu.quant``)
and the product helpers the model's fused q/k/v and gate/up paths share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chatsite_kernels.cpu import linear as cpu_linear
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import PackedQuant
from inference.layers.bf16_weights import Bf16Weight


def weight_key(weight: torch.Tensor) -> tuple[int, int]:
    """Changes when a weight is replaced or edited in place. Inference tensors have no
    version counter; weights are replaced, not edited, there."""
    return weight.data_ptr(), -1 if weight.is_inference() else weight._version


def packable(weight: torch.Tensor | None) -> bool:
    return (
        weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and cpu_linear.available()
    )


def quant_linear(
    x: torch.Tensor, packed: PackedQuant, bias: torch.Tensor | None, silu_pairs: bool = False
) -> torch.Tensor:
    """``chatsite_kernels.cpu.quant.linear``; de-quantizes first for inputs it does not take
    (only reached off the engine's CPU fp32 path)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and cpu_quant.available():
        return cpu_quant.linear(x, packed, bias, silu_pairs=silu_pairs)
    out = F.linear(x, packed.dequantize().to(x.device, x.dtype), bias)
    if silu_pairs:  # rows interleaved 8 gate, 8 up
        pairs = out.unflatten(-1, (-1, 2, 8))
        out = (F.silu(pairs[..., 0, :]) * pairs[..., 1, :]).flatten(-2)
    return out


def unpanel(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """The fp32 weight ``[N, K]`` read back out of packed panels ``[P, K, 16]`` (a view)."""
    return packed.transpose(1, 2).reshape(-1, packed.shape[1])[:out_features]


def unpanel_gate_up(packed: torch.Tensor, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)`` weights, each ``[N, K]``, read back out of interleaved gate/up panels."""
    half = cpu_linear.GATE_UP_PANEL
    return unpanel(packed[:, :, :half], out_features), unpanel(packed[:, :, half:], out_features)


def linear_released(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """A product over a packed weight whose fp32 original was dropped; without the C
    kernel (turned off after packing) the weight is read back out of the panels."""
    if cpu_linear.available():
        return cpu_linear.linear_packed(x, packed, out_features, bias)
    return F.linear(x, unpanel(packed, out_features), bias)


def gate_up_released(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    if cpu_linear.available():
        return cpu_linear.gate_up_silu(x, packed, out_features)
    gate, up = unpanel_gate_up(packed, out_features)
    return F.silu(F.linear(x, gate)) * F.linear(x, up)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and names) whose fp32 CPU products go through
    ``chatsite_kernels.cpu.linear``: decode steps multiply each weight by only a few rows, where
    BLAS streams the weights at a fraction of memory speed. The packed copy the kernel
    reads is made on first use and again whenever the weight changes; ``release_weight``
    (at engine start) then drops the original, so a weight is held once.

    A GGUF weight of a quantized type is held only as ``quant`` (panels of blocks,
    ``chatsite_kernels.cpu.quant``); ``weight`` is None then.

    ``prepare_bf16`` adds a bf16 copy for many-row products (``inference.layers.bf16_weights``)."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple[int, int] | None = None
    quant: PackedQuant | None = None
    bf16: Bf16Weight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bf16 is not None and self.bf16.serves(x):
            return self.bf16.linear(x)
        if self.quant is not None:
            return quant_linear(x, self.quant, self.bias)
        if self.weight is None:  # released: the packed panels are the only copy
            return linear_released(x, self._packed, self.out_features, self.bias)
        if cpu_linear.supports(x, self.weight, self.bias):
            return cpu_linear.linear_packed(x, self.packed_weight(), self.out_features, self.bias)
        return F.linear(x, self.weight, self.bias)

    def prepare_packed(self) -> None:
        if packable(self.weight):
            self.packed_weight()

    def packed_weight(self) -> torch.Tensor:
        if self.weight is None:
            return self._packed
        key = weight_key(self.weight)
        if self._packed is None or self._packed_key != key:
            self._packed, self._packed_key = cpu_linear.pack_weight(self.weight), key
        return self._packed

    def dense_weight(self) -> torch.Tensor | None:
        """The fp32 weight from whichever form holds it (None: a parent's fused product serves it)."""
        if self.quant is not None:
            return self.quant.dequantize()
        if self.weight is not None:
            return self.weight
        return None if self._packed is None else unpanel(self._packed, self.out_features)

    def prepare_bf16(self, min_rows: int | None) -> int:
        """Hold the weight in bf16 too, for products of ``min_rows`` or more rows (None:
        drop the copy); returns its bytes."""
        self.bf16 = None
        weight = self.dense_weight() if min_rows is not None else None
        if weight is None or weight.device.type != "cpu":
            return 0
        self.bf16 = Bf16Weight.of(weight, self.bias, min_rows)
        return self.bf16.nbytes

    def release_weight(self) -> None:
        """Drop the fp32 weight once the packed copy exists (it serves every product)."""
        if self.weight is not None and self._packed is not None:
            self.weight = None

    def set_quantized(self, packed: PackedQuant | None) -> None:
        """Hold ``packed`` as the weight (None: the weight is served by a fused product
        of the parent module) and drop the fp32 parameter."""
        self.quant, self.weight = packed, None
