"""Paged decode attention on CPU: a small C kernel (``kernels/cpu/paged_decode.c``),
built with gcc on first use and loaded with ctypes (``chatsite_kernels.cpu.build``).

Same contract as ``inference.layers.attention.decode_attention_torch`` (and
``chatsite_kernels.reference.paged_attention_ref`` with one query per sequence). The
query, the output and all the arithmetic are fp32; the K/V caches are fp32 or float16
(both the same), each half element widened as it is loaded, so a float16 cache gives
exactly what the fp32 kernel gives on that cache upcast, reading half the bytes.
The kernel reads each sequence's K/V blocks once, in place through the block table,
never past its length, with an online softmax; see the C file for the details. With
``window``, ``softcap`` or ``sinks`` it computes what
``inference.layers.window_attention`` does for one query per sequence (a sliding
window, a logit soft-cap, per-head attention sinks).
If the kernel cannot be built, ``available()`` is False and callers use the PyTorch
path.
"""

from __future__ import annotations

import ctypes

import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks

_SYMBOL = "paged_decode_attention"
# The cache dtypes the kernel reads (its kv16 flag: float16, else float).
CACHE_DTYPES = (torch.float32, torch.float16)


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    fn = getattr(lib, _SYMBOL)
    fn.argtypes = [
        *(ptr, i64, i64),  # query, seq and head strides
        *(ptr, i64, i64, i64),  # k_cache, block / position / head strides
        *(ptr, i64, i64, i64),  # v_cache
        i32,  # num_blocks
        *(ptr, i64, i32),  # block_tables, row stride, width
        ptr,  # context_lens
        *(ptr, i64, i64),  # out, seq and head strides
        *(i32, i32, i32, i32, i32),  # num_seqs, q_heads, kv_heads, head_dim, block_size
        ctypes.c_float,  # scale
        *(i32, ctypes.c_float, ptr),  # window (0: none), softcap (0: none), sinks (NULL: none)
        *(i32, i32),  # kv16, num_threads
    ]
    fn.restype = i32


def _library() -> ctypes.CDLL | None:
    return cpu_build.load_library("paged_decode", _declare)


def available() -> bool:
    """True when the kernel is built (or could be built now) and loaded."""
    return _library() is not None


def supports(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether these tensors can go through the kernel: on the CPU, an fp32 query, fp32
    or float16 caches (both the same), each cache row (``head_dim``) contiguous, and the
    kernel available."""
    return (
        query.device.type == "cpu"
        and query.dtype == torch.float32
        and k_cache.dtype == v_cache.dtype
        and k_cache.dtype in CACHE_DTYPES
        and k_cache.device.type == "cpu"
        and v_cache.device.type == "cpu"
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
        and query.shape[1] % k_cache.shape[2] == 0
        and available()
    )


def paged_decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``query`` ``[B, Hq, D]`` (one new token per sequence, its K/V already stored),
    ``k_cache``/``v_cache`` ``[num_blocks, block_size, Hkv, D]``, fp32 or float16 (strided
    views of the pool are fine), ``block_tables`` ``[B, W]``, ``context_lens`` ``[B]``. Returns
    ``[B, Hq, D]``. Requires ``supports(query, k_cache, v_cache)``.

    ``window``: attend to the last ``window`` positions only (the block table's entries
    before them are never read); ``softcap``: scores become ``softcap * tanh(s /
    softcap)``; ``sinks`` ``[Hq]``: each head's learned logit joins its softmax
    denominator."""
    lib = cpu_build.require("paged_decode", _declare)
    check = cpu_checks
    check.tensor("query", query, dim=3)
    check.tensor("k_cache", k_cache, dtypes=CACHE_DTYPES, dim=4, inner_contiguous=True)
    check.tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), dim=4, inner_contiguous=True)
    check.tensor("block_tables", block_tables, dtypes=check.INDEX_DTYPES, dim=2)
    check.tensor("context_lens", context_lens, dtypes=check.INDEX_DTYPES, dim=1)
    num_seqs, q_heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, k_dim = k_cache.shape
    check.size("k_cache", k_dim, head_dim, "the head size (last dimension)")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    if kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"k_cache: its {kv_heads} KV heads do not divide the query's {q_heads} heads")
    check.at_least("block_tables", block_tables.shape[0], num_seqs, "the number of rows")
    check.at_least("context_lens", context_lens.shape[0], num_seqs, "the length")
    # The kernel takes these as 32-bit ints: checked here, before they are narrowed.
    for what, value in (
        ("query: the number of sequences", num_seqs),
        ("query: the head count", q_heads),
        ("query: the head size", head_dim),
        ("k_cache: the number of blocks", num_blocks),
        ("block_tables: the width", block_tables.shape[1]),
    ):
        check.int32(what, value)
    check.int32("k_cache: the block size", block_size, minimum=1)
    # Every tensor the kernel reads stays referenced by a local until the call returns.
    tables = check.int32_values("block_tables", block_tables)
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    lens = check.int32_values("context_lens", context_lens).contiguous()
    if query.stride(-1) != 1:
        query = query.contiguous()
    if window is not None:
        check.int32("window", window, minimum=1)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap: {softcap} is not positive")
    if sinks is not None:
        check.size("sinks", sinks.numel(), q_heads, "one per query head")
        sinks = sinks.detach().to(device="cpu", dtype=torch.float32).contiguous()
    out = torch.empty(num_seqs, q_heads, head_dim, dtype=query.dtype)
    if num_seqs == 0:
        return out
    ks, vs = k_cache.stride(), v_cache.stride()
    rc = getattr(lib, _SYMBOL)(
        query.data_ptr(),
        query.stride(0),
        query.stride(1),
        k_cache.data_ptr(),
        ks[0],
        ks[1],
        ks[2],
        v_cache.data_ptr(),
        vs[0],
        vs[1],
        vs[2],
        num_blocks,
        tables.data_ptr(),
        tables.stride(0),
        tables.shape[1],
        lens.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        out.stride(1),
        num_seqs,
        q_heads,
        kv_heads,
        head_dim,
        block_size,
        scale,
        window or 0,
        softcap or 0.0,
        sinks.data_ptr() if sinks is not None else None,
        int(k_cache.dtype == torch.float16),
        torch.get_num_threads(),
    )
    cpu_build.check(
        rc,
        _SYMBOL,
        "a context length exceeds its block table, or a block id is outside the cache",
    )
    return out
