"""Small host-side helpers shared by the Triton launchers."""

from __future__ import annotations

import functools

import torch

import triton
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def compute_dtype(t: torch.Tensor) -> tl.dtype:
    """The dtype the attention kernels feed to ``tl.dot``.

    On a GPU we keep 16-bit operands (tensor cores, fp32 accumulate). On CPU the
    kernels only run under ``TRITON_INTERPRET=1``, which has no bf16/fp16
    arithmetic, so everything is promoted to fp32 there.
    """
    if t.device.type != "cuda" or t.dtype not in _TL_DTYPES:
        return tl.float32
    return _TL_DTYPES[t.dtype]


def dot_precision(dtype: tl.dtype) -> str:
    # fp32 operands would silently use TF32 on a GPU (10-bit mantissa); ask for IEEE
    # so fp32 caches get fp32 results. The setting is ignored for 16-bit operands.
    return "ieee" if dtype == tl.float32 else "tf32"


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a nominal 8 off CUDA (for split heuristics)."""
    if device.type != "cuda":
        return 8
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
