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
