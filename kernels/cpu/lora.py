"""Batched LoRA shrink and expand on CPU in C (``kernels/cpu/lora.c``): the rows of one
batch each run their own adapter (or none), the base weights' product having run once for
all of them. Same semantics as ``chatsite_kernels.reference.lora_shrink_ref`` /
``lora_expand_ref``. Built with gcc on first use (``chatsite_kernels.cpu.build``);
callers check ``available()`` and fp32 CPU tensors, and keep the reference otherwise."""

from __future__ import annotations

import ctypes

import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.lora_shrink_f32.argtypes = [ptr, i64, ptr, i64, i64, i64, ptr, i64, ptr, i64, i32]
    lib.lora_expand_f32.argtypes = [ptr, i64, ptr, i64, i64, i64, ptr, ptr, i64, ptr, i64, i32]
    group = [ptr, i64, i64, ptr, i64, i64, i32, ptr, ptr, ptr, i64, ptr, ptr, i64, ptr, i32]
    lib.lora_group_f32.argtypes = group
    lib.lora_swiglu_f32.argtypes = [
        ptr,
        i64,
        i64,
        ptr,
        i64,
        i64,
        ptr,
        i64,
        ptr,
        ptr,
        i64,
        ptr,
        ptr,
        i64,
        ptr,
        i32,
    ]
    for fn in (lib.lora_shrink_f32, lib.lora_expand_f32, lib.lora_group_f32, lib.lora_swiglu_f32):
        fn.restype = i32


def available() -> bool:
    return cpu_build.load_library("lora", _declare) is not None


def _slots(slots: torch.Tensor, rows: int) -> torch.Tensor:
    cpu_checks.tensor("slots", slots, dtypes=(torch.int32,), dim=1)
    cpu_checks.size("slots", slots.shape[0], rows, "the length")
    return slots.contiguous()


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, K]`` rows, adapters ``a`` ``[S, R, K]`` -> ``[T, R]``."""
    cpu_checks.tensor("a", a, dim=3, contiguous=True)
    s, r, k = a.shape
    rows = cpu_build.as_rows(x, k)
    slots = _slots(slots, rows.shape[0])
    out = torch.empty(rows.shape[0], r, dtype=torch.float32)
    rc = cpu_build.require("lora", _declare).lora_shrink_f32(
        rows.data_ptr(), rows.stride(0), a.data_ptr(), s, r, k, slots.data_ptr(), rows.shape[0],
        out.data_ptr(), r, torch.get_num_threads(),
    )  # fmt: skip
    cpu_build.check(rc, "lora_shrink_f32", "slots: a slot is out of range")
    return out


def lora_expand(
    y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[t] += scales[s] * b[s] @ y[t]`` in place; ``out`` ``[T, N]`` may be a column
    slice of a wider buffer (unit inner stride)."""
    cpu_checks.tensor("b", b, dim=3, contiguous=True)
    cpu_checks.tensor("y", y, dim=2, inner_contiguous=True)
    cpu_checks.tensor("scales", scales, dim=1, contiguous=True)
    cpu_checks.tensor("out", out, dim=2, inner_contiguous=True)
    s, n, r = b.shape
    t = out.shape[0]
    cpu_checks.size("out", out.shape[1], n, "the width")
    cpu_checks.size("y", y.shape[1], r, "the width")
    cpu_checks.size("scales", scales.shape[0], s, "the length")
    slots = _slots(slots, t)
    rc = cpu_build.require("lora", _declare).lora_expand_f32(
        y.data_ptr(), y.stride(0), b.data_ptr(), s, n, r, slots.data_ptr(), scales.data_ptr(), t,
        out.data_ptr(), out.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    cpu_build.check(rc, "lora_expand_f32", "slots: a slot is out of range")


def _pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


def lora_group(
    x: torch.Tensor,
    a: torch.Tensor,
    bs: list[torch.Tensor],
    slots: torch.Tensor,
    scales: torch.Tensor,
    outs: list[torch.Tensor],
) -> None:
    """A projection group in one call: ``outs[i] += scales[s] * bs[i][s] @ (a[s] @ x)[i R:(i+1) R]``,
    ``a`` ``[S, len(bs) R, K]``, ``bs[i]`` ``[S, N_i, R]``, ``outs`` column slices of one buffer
    (one row stride). The decode stack's path, exposed for its tests."""
    s, gr, k = a.shape
    r, t = gr // len(bs), x.shape[0]
    y = torch.empty(t, gr)
    widths = (ctypes.c_int64 * len(bs))(*(b.shape[1] for b in bs))
    rc = cpu_build.require("lora", _declare).lora_group_f32(
        x.data_ptr(), x.stride(0), k, a.data_ptr(), s, r, len(bs), _pointers(bs), widths,
        _pointers(outs), outs[0].stride(0), _slots(slots, t).data_ptr(), scales.data_ptr(), t,
        y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    cpu_build.check(rc, "lora_group_f32", "slots: a slot is out of range")


def lora_swiglu(
    x: torch.Tensor,
    a: torch.Tensor,
    bs: list[torch.Tensor],
    slots: torch.Tensor,
    scales: torch.Tensor,
    raw: torch.Tensor,
) -> torch.Tensor:
    """``silu(gate) * up`` ``[T, P]`` with the adapters' products added to ``raw`` ``[T, 2 P]``
    (gate and up interleaved 8 by 8, updated in place); ``bs`` gate's and up's B. The decode
    stack's path, exposed for its tests."""
    s, gr, k = a.shape
    t, inter = x.shape[0], bs[0].shape[1]
    out = torch.empty(t, raw.shape[1] // 2)
    y = torch.empty(t, gr)
    rc = cpu_build.require("lora", _declare).lora_swiglu_f32(
        x.data_ptr(), x.stride(0), k, a.data_ptr(), s, gr // 2, _pointers(bs), inter, raw.data_ptr(),
        out.data_ptr(), out.stride(0), _slots(slots, t).data_ptr(), scales.data_ptr(), t, y.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    cpu_build.check(rc, "lora_swiglu_f32", "slots: a slot is out of range")
    return out
