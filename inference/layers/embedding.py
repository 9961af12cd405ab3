"""Token embedding that can read its rows from a quantized weight or from the tied LM
head's packed panels, so the embedding holds no copy of its own."""

from __future__ import annotations

import torch
from torch import nn

from chatsite_kernels.cpu import linear as cpu_linear
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import PackedQuant


class Embedding(nn.Embedding):
    """``nn.Embedding`` that can also look rows up in a quantized weight (``quant``) or
    in the fp32 panels of the tied LM head (``panels``) once its own weight is dropped;
    either way only the rows asked for are read."""

    quant: PackedQuant | None = None
    panels: torch.Tensor | None = None  # the tied LM head's packed weight [ceil(V / 16), H, 16]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return cpu_quant.embedding(ids, self.quant)
        if self.weight is None and self.panels is not None:
            flat = ids.reshape(-1).long()
            rows = self.panels[flat // cpu_linear.PANEL, :, flat % cpu_linear.PANEL]
            return rows.view(*ids.shape, self.embedding_dim)
        return super().forward(ids)
