"""bf16 copies of a model's CPU weights for many-row products (``inference.layers.cpu_matmul``).

Where a model's policy says bf16, each projection (quantized or fp32) also holds its weight
de-quantized into bf16 once, at engine start; a product of at least ``min_rows`` rows then
runs as one oneDNN bf16 GEMM (AMX tiles where the CPU has them) with fp32 accumulation and
an fp32 result, the bias added in fp32. Fewer rows keep the quantized/fp32 kernels, which
read the smaller weights (those rows are memory-bound). The copy costs 2 bytes a parameter
on top of the quantized panels.

``attach`` walks a model once and asks each module that owns products (``Linear``, the fused
q/k/v of ``Attention``, the fused gate/up of ``MLP``) to make its copies. The LM head stays
fp32 (its logits pick the tokens, and prefill asks it for one row per sequence), as do the
routed experts and routers of a mixture of experts (PyTorch's own fp32 products), and any
module without ``prepare_bf16``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.layers.cpu_matmul import CpuMatmul

_SKIPPED = ("lm_head",)  # the logits' product stays fp32


@dataclass(frozen=True)
class Bf16Weight:
    """A weight ``[N, K]`` in bf16 and its fp32 bias, used for products of ``min_rows`` or more rows."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    min_rows: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, min_rows: int) -> Bf16Weight:
        bias = None if bias is None else bias.detach().float()
        return cls(weight.detach().to(torch.bfloat16).contiguous(), bias, min_rows)

    def serves(self, x: torch.Tensor) -> bool:
        rows = x.numel() // max(x.shape[-1], 1)
        return rows >= self.min_rows and x.device.type == "cpu" and x.dtype == torch.float32

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x.to(torch.bfloat16), self.weight).float()
        if self.bias is not None:
            out += self.bias
        return out

    def silu_gate_up(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for a weight stacked ``[gate; up]``, in fp32."""
        gate, up = self.linear(x).chunk(2, dim=-1)
        return F.silu(gate) * up

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


def attach(model: nn.Module, policy: CpuMatmul) -> int:
    """Give ``model``'s projections their bf16 copies where ``policy`` says bf16, or drop
    any they hold where it says fp32 (a model object can serve one engine, then another
    with the other policy: the last engine built sets it); returns the bytes held."""
    return _walk(model, policy.min_rows if policy.bf16 else None, "")


def _walk(module: nn.Module, min_rows: int | None, name: str) -> int:
    if name in _SKIPPED:
        return 0
    prepare = getattr(module, "prepare_bf16", None)
    if prepare is not None:  # the module covers its own projections
        return prepare(min_rows)
    return sum(
        _walk(child, min_rows, f"{name}.{child_name}" if name else child_name)
        for child_name, child in module.named_children()
    )
