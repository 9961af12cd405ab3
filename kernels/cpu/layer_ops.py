"""Per-layer glue of a decoder step on CPU in C (``kernels/cpu/layer_ops.c``): RMSNorm
with the residual add fused in, rotary embedding plus K/V store, and the greedy
argmax over the vocabulary. Built with gcc on first use (``chatsite_kernels.cpu.build``).

Each replaces a group of small PyTorch ops whose dispatch costs more than their
arithmetic at decode sizes. Callers check ``available()`` (and fp32 CPU tensors, or
``is_cpu_cache`` for the KV cache, which may also be float16) and keep their PyTorch
path for everything else. A float16 cache is written rounded to nearest even, the
bits ``tensor.to(torch.float16)`` gives, so the C and the PyTorch store agree.
"""

from __future__ import annotations

import ctypes

import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks

# rotary_store's entry point by KV cache dtype.
_ROTARY_SYMBOLS = {torch.float32: "rotary_store_f32", torch.float16: "rotary_store_f16kv"}
CACHE_DTYPES = tuple(_ROTARY_SYMBOLS)


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.rms_norm_f32.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, f32, i32]
    for name in _ROTARY_SYMBOLS.values():
        getattr(lib, name).argtypes = [
            *(ptr, i64, i64, i32, i32, i32),  # qkv, row stride, tokens, q heads, kv heads, head dim
            *(ptr, ptr),  # cos_sin, slots
            *(ptr, i64, i64, i64),  # k_cache, block / position / head strides (in elements)
            *(ptr, i64, i64, i64),  # v_cache
            *(i64, i32, i32),  # num_blocks, block_size, threads
        ]
    lib.argmax_rows_f32.argtypes = [ptr, i64, i64, i64, ptr, i32]
    for fn in (lib.rms_norm_f32, *(getattr(lib, n) for n in _ROTARY_SYMBOLS.values()), lib.argmax_rows_f32):
        fn.restype = i32


def _library() -> ctypes.CDLL | None:
    return cpu_build.load_library("layer_ops", _declare)


def available() -> bool:
    return _library() is not None


def is_cpu_f32(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def is_cpu_cache(kv_cache: torch.Tensor) -> bool:
    """A KV cache ``rotary_store`` can write: on the CPU, fp32 or float16."""
    return kv_cache.device.type == "cpu" and kv_cache.dtype in CACHE_DTYPES


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``x`` ``[..., N]`` normalised and scaled by ``weight``. With ``residual``
    (contiguous ``[M, N]``, M = rows of ``x``), first ``residual += x`` in place, and the
    sum is what is normalised."""
    cpu_checks.tensor("x", x, min_dim=1)
    cpu_checks.tensor("weight", weight, dim=1)
    if x.shape[-1] < 1:
        raise ValueError("x: the last dimension is empty")
    cpu_checks.size("weight", weight.shape[0], x.shape[-1], "the length")
    rows = cpu_build.as_rows(x, x.shape[-1])
    m, n = rows.shape
    if residual is not None:
        cpu_checks.tensor("residual", residual, dim=2, contiguous=True)
        if tuple(residual.shape) != (m, n):
            raise ValueError(f"residual must be [{m}, {n}] (the rows of x), got {tuple(residual.shape)}")
    weight = weight.contiguous()  # held by this name until the call returns
    out = torch.empty(m, n, dtype=x.dtype)
    rc = cpu_build.require("layer_ops", _declare).rms_norm_f32(
        rows.data_ptr(),
        rows.stride(0),
        None if residual is None else residual.data_ptr(),
        n,
        weight.data_ptr(),
        out.data_ptr(),
        n,
        m,
        n,
        eps,
        torch.get_num_threads(),
    )
    cpu_build.check(rc, "rms_norm_f32")
    return out.view(x.shape)


def rotary_store(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    cos_sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> None:
    """In place on ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` (q, k, v heads in that order, unit
    inner stride): rotate the q and k heads with ``cos_sin`` ``[T, D]`` (cos | sin),
    then write each token's k and v heads to ``k_cache``/``v_cache`` ``[num_blocks,
    block_size, Hkv, D]`` (strided views are fine; fp32, or float16 rounded to nearest
    even as ``.to(torch.float16)`` rounds) at ``slot_mapping`` (-1 = skip)."""
    check = cpu_checks
    check.tensor("qkv", qkv, dim=2)
    check.tensor("cos_sin", cos_sin, dim=2)
    check.tensor("slot_mapping", slot_mapping, dtypes=check.INDEX_DTYPES, dim=1)
    check.tensor("k_cache", k_cache, dtypes=CACHE_DTYPES, dim=4, inner_contiguous=True)
    check.tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), dim=4, inner_contiguous=True)
    tokens, head_dim = qkv.shape[0], cos_sin.shape[-1]
    if num_heads < 1 or num_kv_heads < 1:
        raise ValueError(f"num_heads ({num_heads}) and num_kv_heads ({num_kv_heads}) must be positive")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"cos_sin: the head size {head_dim} must be even")
    if qkv.stride(-1) != 1 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError("qkv is not [T, (Hq + 2 Hkv) * D] with unit inner stride")
    check.size("cos_sin", cos_sin.shape[0], tokens, "the number of rows")
    check.size("slot_mapping", slot_mapping.shape[0], tokens, "the length")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    check.size("k_cache", k_cache.shape[2], num_kv_heads, "the head count")
    check.size("k_cache", k_cache.shape[3], head_dim, "the head size")
    # The kernel takes these as 32-bit ints (and adds the head counts): checked before.
    check.int32("num_heads + 2 * num_kv_heads", num_heads + 2 * num_kv_heads)
    check.int32("cos_sin: the head size", head_dim)
    check.int32("k_cache: the block size", k_cache.shape[1], minimum=1)
    # Copies stay referenced by these names until the call returns.
    cos_sin = cos_sin.contiguous()
    slots = (slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()).contiguous()
    ks, vs = k_cache.stride(), v_cache.stride()
    symbol = _ROTARY_SYMBOLS[k_cache.dtype]
    rc = getattr(cpu_build.require("layer_ops", _declare), symbol)(
        qkv.data_ptr(),
        qkv.stride(0) if tokens > 1 else qkv.shape[1],
        tokens,
        num_heads,
        num_kv_heads,
        head_dim,
        cos_sin.data_ptr(),
        slots.data_ptr(),
        k_cache.data_ptr(),
        *ks[:3],
        v_cache.data_ptr(),
        *vs[:3],
        k_cache.shape[0],
        k_cache.shape[1],
        torch.get_num_threads(),
    )
    cpu_build.check(rc, symbol, f"{symbol}: a slot is outside the KV cache")


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D fp32 CPU tensor, int64."""
    cpu_checks.tensor("x", x, dim=2)
    if x.shape[1] < 1:
        raise ValueError("x: the rows are empty")
    rows = cpu_build.as_rows(x, x.shape[-1])
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    rc = cpu_build.require("layer_ops", _declare).argmax_rows_f32(
        rows.data_ptr(), rows.stride(0), rows.shape[0], rows.shape[1], out.data_ptr(), torch.get_num_threads()
    )
    cpu_build.check(rc, "argmax_rows_f32")
    return out
