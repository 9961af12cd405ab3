"""MXFP4 written from the OCP Microscaling spec (v1.0, section 5.3 and 6.3), independently
of ``inference.runner.mxfp4``: an E2M1 element is sign, 2-bit exponent (bias 1), 1-bit
mantissa, subnormal when the exponent is 0; a block of 32 shares an E8M0 scale
``2 ** (stored - 127)``. The tests check our de-quantizer against this one, and use its
quantizer to write gpt-oss checkpoints."""

from __future__ import annotations

import math

import torch


def e2m1_value(code: int) -> float:
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 0b1
    if exponent == 0:  # subnormal: 0 or 0.5
        return sign * mantissa * 0.5
    return sign * 2.0 ** (exponent - 1) * (1 + mantissa / 2)


def e8m0_value(stored: int) -> float:
    return math.ldexp(1.0, stored - 127)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """safetensors layout (``[..., G, 16]`` bytes, element ``2j`` in byte ``j``'s low
    nibble, ``2j + 1`` in its high one) -> ``[..., G * 32]`` fp32, element by element."""
    flat_b = blocks.reshape(-1, 16).tolist()
    flat_s = scales.reshape(-1).tolist()
    values = []
    for row, stored in zip(flat_b, flat_s, strict=True):
        scale = e8m0_value(stored)
        for byte in row:
            values += [e2m1_value(byte & 0xF) * scale, e2m1_value(byte >> 4) * scale]
    return torch.tensor(values, dtype=torch.float32).reshape(*scales.shape[:-1], -1)


def dequantize_gguf_mxfp4(raw: bytes, count: int) -> list[float]:
    """GGUF layout: 17-byte blocks (scale byte, 16 bytes: element ``j`` in byte ``j``'s low
    nibble, ``j + 16`` in its high one)."""
    out: list[float] = []
    for start in range(0, count // 32 * 17, 17):
        scale, qs = e8m0_value(raw[start]), raw[start + 1 : start + 17]
        out += [e2m1_value(b & 0xF) * scale for b in qs] + [e2m1_value(b >> 4) * scale for b in qs]
    return out


_CODES = torch.tensor([e2m1_value(c) for c in range(8)])  # the non-negative values


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., K]`` (K a multiple of 32) -> (blocks ``[..., K/32, 16]``, scales
    ``[..., K/32]``) uint8: each block's scale is the power of two that puts its largest
    magnitude at or under 6 (E2M1's largest), each element the nearest code."""
    groups = x.float().reshape(*x.shape[:-1], -1, 32)
    amax = groups.abs().amax(dim=-1).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    codes = (scaled.abs()[..., None] - _CODES).abs().argmin(dim=-1)
    codes = codes | ((scaled < 0).long() << 3)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exponent + 127).to(torch.uint8)
