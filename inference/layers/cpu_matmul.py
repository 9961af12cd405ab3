"""Which precision the CPU's many-row products run in.

On a CPU with AMX-BF16 tiles (Intel Sapphire Rapids and later), PyTorch's oneDNN runs a
bf16 matrix product several times faster than fp32 once it has a few dozen rows (the fp32
kernels are compute-bound there; a one-row decode is memory-bound either way). Prefill
chunks are such products. bf16 rounds the operands (8 significant bits; products still
accumulate in fp32), so the logits move by about bf16's rounding and are no longer fp32's;
``"fp32"`` keeps every product in fp32 (what the exactness tests against transformers use).

- ``"fp32"``: every CPU product in fp32 (the engine's default).
- ``"bf16"``: products of at least ``min_rows`` rows in bf16, on any CPU.
- ``"auto"``: ``"bf16"`` where the CPU has AMX-BF16 tiles, else ``"fp32"`` (the site's default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHOICES = ("fp32", "bf16", "auto")
MIN_ROWS = 16  # fewer rows: the quantized/fp32 kernels (memory-bound rows gain nothing)


@dataclass(frozen=True)
class CpuMatmul:
    """The resolved policy one model's CPU products follow."""

    bf16: bool = False
    min_rows: int = MIN_ROWS


def has_amx_bf16() -> bool:
    """Does this CPU have AMX tiles with bf16 (and may this process use them)?"""
    try:
        return bool(torch.cpu._is_amx_tile_supported()) and bool(torch.cpu._is_avx512_bf16_supported())
    except (AttributeError, RuntimeError):  # an older torch or a platform without the probe
        return False


def resolve_cpu_matmul(choice: str, device: torch.device) -> CpuMatmul:
    """The policy for ``choice`` (one of ``CHOICES``) on ``device``: fp32 off the CPU."""
    if choice not in CHOICES:
        raise ValueError(f"cpu_matmul must be one of {', '.join(CHOICES)}, got {choice!r}")
    if device.type != "cpu":
        return CpuMatmul(bf16=False)
    return CpuMatmul(bf16=choice == "bf16" or (choice == "auto" and has_amx_bf16()))
