"""The gated delta rule of a Gated DeltaNet layer on CPU in C (``kernels/cpu/gated_delta.c``):
decode steps and prefill spans of a packed step in one call, each sequence's state read
from and written back to its slot of the state pool in place. Built with gcc on first use
(``chatsite_kernels.cpu.build``); the reference is
``chatsite_kernels.gated_delta_reference.gated_delta_varlen``.
"""

from __future__ import annotations

import ctypes

import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.gated_delta_varlen_f32.argtypes = [
        *(ptr, ptr, ptr, ptr, ptr, ptr),  # q, k, v, g, beta, out
        *(ptr, i64, ptr, ptr, ptr),  # pool, num_slots, slots, has_initial, query_start_loc
        *(i32, i32, i32, i32, i32),  # sequences, heads, Dk, Dv, threads
    ]
    lib.gated_delta_varlen_f32.restype = i32


def available() -> bool:
    return cpu_build.load_library("gated_delta", _declare) is not None


def supports(*tensors: torch.Tensor) -> bool:
    """Whether the C path takes these tensors (fp32 on the CPU) and the kernel is built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and available()


def gated_delta_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> torch.Tensor:
    """``q``, ``k`` ``[T, H, Dk]``, ``v`` ``[T, H, Dv]``, ``g``, ``beta`` ``[T, H]`` (fp32),
    ``ssm_pool`` ``[S, H, Dk, Dv]`` (contiguous, updated in place), ``slots`` ``[B]``,
    ``has_initial`` ``[B]`` bool, ``query_start_loc`` ``[B+1]``; returns ``[T, H, Dv]``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        cpu_checks.tensor(name, t, dim=3)
    tokens, heads, dk = q.shape
    cpu_checks.tensor("ssm_pool", ssm_pool, dim=4, contiguous=True)
    if tuple(k.shape) != (tokens, heads, dk):
        raise ValueError(f"k must be {(tokens, heads, dk)} like q, got {tuple(k.shape)}")
    dv = v.shape[-1]
    if tuple(v.shape) != (tokens, heads, dv):
        raise ValueError(f"v must be [{tokens}, {heads}, Dv], got {tuple(v.shape)}")
    for name, t in (("g", g), ("beta", beta)):
        cpu_checks.tensor(name, t, dim=2)
        if tuple(t.shape) != (tokens, heads):
            raise ValueError(f"{name} must be {(tokens, heads)}, got {tuple(t.shape)}")
    if tuple(ssm_pool.shape[1:]) != (heads, dk, dv):
        raise ValueError(f"ssm_pool must be [S, {heads}, {dk}, {dv}], got {tuple(ssm_pool.shape)}")
    slots = (
        cpu_checks.tensor("slots", slots, dtypes=cpu_checks.INDEX_DTYPES, dim=1).to(torch.int64).contiguous()
    )
    num_seqs = slots.shape[0]
    has_initial = cpu_checks.tensor("has_initial", has_initial, dtypes=(torch.bool,), dim=1)
    cpu_checks.size("has_initial", has_initial.shape[0], num_seqs, "the length")
    if slots.unique().numel() != num_seqs:  # two scans writing one state would race
        raise ValueError("slots: two sequences of one step share a state slot")
    starts = cpu_checks.tensor("query_start_loc", query_start_loc, dtypes=cpu_checks.INDEX_DTYPES, dim=1)
    cpu_checks.size("query_start_loc", starts.shape[0], num_seqs + 1, "the length")
    starts = cpu_checks.int32_values("query_start_loc", starts).contiguous()
    if num_seqs and int(starts[-1]) > tokens:
        raise ValueError(f"query_start_loc ends at {int(starts[-1])}, past the {tokens} rows")
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))  # held until the call returns
    flags = has_initial.to(torch.uint8).contiguous()
    out = torch.empty(tokens, heads, dv, dtype=torch.float32)
    rc = cpu_build.require("gated_delta", _declare).gated_delta_varlen_f32(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        g.data_ptr(),
        beta.data_ptr(),
        out.data_ptr(),
        ssm_pool.data_ptr(),
        ssm_pool.shape[0],
        slots.data_ptr(),
        flags.data_ptr(),
        starts.data_ptr(),
        num_seqs,
        cpu_checks.int32("heads", heads, minimum=1),
        cpu_checks.int32("Dk", dk, minimum=1),
        cpu_checks.int32("Dv", dv, minimum=1),
        torch.get_num_threads(),
    )
    cpu_build.check(rc, "gated_delta_varlen_f32", "slots: a slot outside the state pool")
    return out
