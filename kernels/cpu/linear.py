"""Linear layers on CPU: a small C GEMM kernel (``kernels/cpu/linear.c``) over weights
packed in panels of 16 output features, built with gcc on first use and loaded with
ctypes (``chatsite_kernels.cpu.build``).

Decode steps multiply each weight by one row per running sequence. On a small CPU,
BLAS streams the weights for such products at a fraction of memory speed, and at 64
rows reaches about half its own peak; the packed kernel streams them at memory speed
and keeps the FMA units busy from about 16 rows up (see the C file, and
``benchmarks/bench_cpu_linear.py`` for the figures). It matches BLAS on prefill-sized
products too, so every fp32 CPU product goes through it when it is available.

SwiGLU's gate and up projections fuse into one call (``pack_gate_up`` and
``gate_up_silu``) that returns ``silu(x Wg^T) * (x Wu^T)`` without writing either
product to memory.

The packed copy is made once per weight (``pack_weight``) and held by the caller next
to the original, so a model that uses it holds its linear weights twice in memory.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks

_SYMBOL = "linear_packed_f32"
_GATE_UP_SYMBOL = "gate_up_silu_f32"
PANEL = 16
GATE_UP_PANEL = 8


def _declare(lib: ctypes.CDLL) -> None:
    fn = getattr(lib, _SYMBOL)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    fn.restype = ctypes.c_int
    fused = getattr(lib, _GATE_UP_SYMBOL)
    fused.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    fused.restype = ctypes.c_int


def _library() -> ctypes.CDLL | None:
    return cpu_build.load_library("linear", _declare)


def available() -> bool:
    return _library() is not None


def supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """fp32 CPU tensors of matching inner size, no autograd, and the kernel available."""
    return (
        x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and weight.dim() == 2
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[1]
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and available()
    )


def pack_weight(weight: torch.Tensor, panel: int = PANEL) -> torch.Tensor:
    """``[N, K]`` (nn.Linear's layout) -> ``[ceil(N/panel), K, panel]``: panel p holds
    output features p*panel.., k-major, zero-padded past N."""
    n, k = weight.shape
    padded = F.pad(weight.detach(), (0, 0, 0, -n % panel))
    return padded.view(-1, panel, k).transpose(1, 2).contiguous()


def pack_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Two ``[N, K]`` weights -> ``[ceil(N/8), K, 16]``: per panel and k step, 8 gate
    then 8 up features."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    return torch.cat((pack_weight(gate, GATE_UP_PANEL), pack_weight(up, GATE_UP_PANEL)), dim=2).contiguous()


def gate_up_silu(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``F.silu(F.linear(x, gate)) * F.linear(x, up)`` with ``packed =
    pack_gate_up(gate, up)`` (no biases)."""
    lib = cpu_build.require("linear", _declare)
    _check_packed(x, packed)
    k = packed.shape[1]
    if (
        packed.shape[0] * GATE_UP_PANEL < out_features
        or packed.shape[2] != 2 * GATE_UP_PANEL
        or not packed.is_contiguous()
    ):
        raise ValueError("packed is not pack_gate_up() of weights with this many outputs")
    rows = cpu_build.as_rows(x, k)
    out = torch.empty(rows.shape[0], out_features, dtype=x.dtype)
    fn = getattr(lib, _GATE_UP_SYMBOL)
    rc = fn(rows.data_ptr(), rows.stride(0), packed.data_ptr(), out.data_ptr(), out_features,
            rows.shape[0], out_features, k, torch.get_num_threads())  # fmt: skip
    cpu_build.check(rc, _GATE_UP_SYMBOL)
    return out.view(*x.shape[:-1], out_features)


def _check_packed(x: torch.Tensor, packed: torch.Tensor) -> None:
    cpu_checks.tensor("x", x, min_dim=1)
    cpu_checks.tensor("packed", packed, dim=3, contiguous=True)
    cpu_checks.size("x", x.shape[-1], packed.shape[1], "the last dimension (K)")


def linear_packed(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``packed = pack_weight(weight)``."""
    lib = cpu_build.require("linear", _declare)
    _check_packed(x, packed)
    k = packed.shape[1]
    if packed.shape[0] * PANEL < out_features or packed.shape[2] != PANEL or not packed.is_contiguous():
        raise ValueError("packed is not pack_weight() of a weight with this many outputs")
    if bias is not None:
        cpu_checks.tensor("bias", bias, dim=1)
        cpu_checks.size("bias", bias.shape[0], out_features, "the length")
        bias = bias.contiguous()  # held by this name until the call returns
    rows = cpu_build.as_rows(x, k)
    out = torch.empty(rows.shape[0], out_features, dtype=x.dtype)
    rc = getattr(lib, _SYMBOL)(
        rows.data_ptr(),
        rows.stride(0),
        packed.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        out_features,
        rows.shape[0],
        out_features,
        k,
        torch.get_num_threads(),
    )
    cpu_build.check(rc, _SYMBOL)
    return out.view(*x.shape[:-1], out_features)
