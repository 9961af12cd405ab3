"""RMSNorm, with the residual add fused in (``add_norm``); fp32 CPU inputs go through
``chatsite_kernels.cpu.layer_ops``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chatsite_kernels.cpu import layer_ops as cpu_layer_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:
            if cpu_layer_ops.is_cpu_f32(x, self.weight) and cpu_layer_ops.available():
                return cpu_layer_ops.rms_norm(x, self.weight, self.eps)
            # One fused op, the same arithmetic as below when nothing is cast.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 and scale after casting back, as HF's LlamaRMSNorm does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``; on the CPU in fp32 one C call that
        adds into ``residual`` in place (the decoder's own running sum)."""
        if (
            cpu_layer_ops.is_cpu_f32(x, residual, self.weight)
            and residual.is_contiguous()
            and cpu_layer_ops.available()
        ):
            return cpu_layer_ops.rms_norm(x, self.weight, self.eps, residual=residual), residual
        residual = residual + x
        return self(residual), residual


class ZeroCenteredRMSNorm(nn.Module):
    """``x / rms(x) * (1 + w)`` in fp32, cast back after the scaling (Gemma, Qwen3-Next
    and Qwen3.5 store the weights centred on zero)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """The Gated DeltaNet's output norm: ``w * x / rms(x) * silu(gate)``, normalised in
    fp32, scaled in the input's dtype, gated in fp32 (transformers' order)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scaled = self.weight * xf.to(x.dtype)
        return (scaled * F.silu(gate.float())).to(x.dtype)
