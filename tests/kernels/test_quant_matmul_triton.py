"""The Triton kernel over quantized panels (``chatsite_kernels.triton.quant_matmul``) against
``F.linear`` on the exactly de-quantized weights, one small case per GGUF type (run
under the interpreter where there is no GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import quant as cpu_quant
from inference.runner.gguf.blocks import GGUF_TYPES, parse_gguf_blocks
from tests.kernels.cases import DEVICE, requires_backend
from tests.kernels.test_cpu_quant import random_blocks

requires_backend()
quant_matmul = pytest.importorskip("chatsite_kernels.triton.quant_matmul").quant_matmul


@pytest.mark.parametrize("type_name", list(GGUF_TYPES))
def test_triton_quant_matmul_matches_f_linear(type_name: str) -> None:
    rows, outputs, inner = 5, 21, 256  # outputs not a multiple of 16
    raw = random_blocks(type_name, outputs, inner, seed=7)
    packed = cpu_quant.pack(parse_gguf_blocks(type_name, raw, (outputs, inner)))
    w = packed.dequantize()
    x = torch.randn(rows, inner, generator=torch.Generator().manual_seed(3))
    on_device = cpu_quant.PackedQuant(packed.fmt, packed.data.to(DEVICE), outputs, inner)
    out = quant_matmul(x.to(DEVICE), on_device).cpu()
    expected = F.linear(x.double(), w.double()).float()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
