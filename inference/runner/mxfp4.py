"""MXFP4 (OCP Microscaling, FP4 elements) de-quantization, for gpt-oss's expert weights.

A block is 32 E2M1 values (1 sign, 2 exponent, 1 mantissa bits: 0, 0.5, 1, 1.5, 2, 3, 4,
6 and their negatives) sharing one E8M0 scale (a bare exponent: ``2 ** (e - 127)``).
Two layouts carry it:

- **safetensors** (``*_blocks`` ``[..., rows, G, 16]`` uint8, ``*_scales`` ``[..., rows, G]``
  uint8): byte ``j`` of a block holds elements ``2j`` (low nibble) and ``2j + 1`` (high);
- **GGUF** (type MXFP4, 17 bytes a block: the scale byte, then 16 bytes): byte ``j`` holds
  elements ``j`` (low nibble) and ``j + 16`` (high).

Both are de-quantized at load into the model's dtype (``inference.models.gpt_oss``).
"""

from __future__ import annotations

import torch

# E2M1 code -> value: sign bit 3, then exponent and mantissa.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32


def _scale(exponents: torch.Tensor) -> torch.Tensor:
    """E8M0 -> fp32 ``2 ** (e - 127)`` (255, NaN in the spec, is not produced by writers)."""
    return torch.ldexp(torch.ones_like(exponents, dtype=torch.float32), exponents.to(torch.int32) - 127)


def dequantize_blocks(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """safetensors layout: ``blocks`` ``[..., G, 16]`` and ``scales`` ``[..., G]`` ->
    ``[..., G * 32]`` values (each row's elements in order)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, not {blocks.dtype} / {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales {tuple(scales.shape)}")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    lo, hi = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    values = torch.stack((lo, hi), dim=-1).flatten(-2)  # [..., G, 32]: low nibble first
    values = values * _scale(scales)[..., None]
    return values.flatten(-2).to(dtype)


def dequantize_gguf(raw: torch.Tensor, num_values: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """GGUF layout: ``raw`` uint8 ``[..., num_values / 32 * 17]`` -> ``[..., num_values]``."""
    if num_values % BLOCK or raw.shape[-1] != num_values // BLOCK * 17:
        raise ValueError(f"MXFP4 data of {raw.shape[-1]} bytes per row does not hold {num_values} values")
    b = raw.reshape(*raw.shape[:-1], num_values // BLOCK, 17)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    qs = b[..., 1:]
    values = torch.cat((lut[(qs & 0x0F).long()], lut[(qs >> 4).long()]), dim=-1)  # elements j, then j + 16
    values = values * _scale(b[..., 0])[..., None]
    return values.flatten(-2).to(dtype)
