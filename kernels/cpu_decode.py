"""Paged decode attention on CPU: a small C kernel (``kernels/cpu/paged_decode.c``),
built with gcc on first use and loaded with ctypes.

Same contract as ``inference.attention.decode_attention_torch`` (and
``kernels.reference.paged_attention_ref`` with one query per sequence), fp32 only.
The kernel reads each sequence's K/V blocks once, in place through the block table,
never past its length, with an online softmax; see the C file for the details.

Build cache: ``$CHATSITE_KERNEL_CACHE`` or ``~/.cache/chatsite-kernels``. The file
name is a hash of the source, the compiler command and the CPU (``-march=native``
code only runs where its instructions exist, and the cache may be shared between
machines). A build goes to a temporary name and is renamed into place, so processes
building at the same time never load a half-written library.

If gcc is missing or the build or load fails, ``available()`` is False (one warning
is logged) and callers use the PyTorch path; ``CHATSITE_CPU_KERNELS=0`` turns the
kernel off on purpose (to compare, or to rule it out).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu") / "paged_decode.c"
COMPILER = "gcc"
# No -ffast-math: results must stay within float rounding of the references.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-Wall")
LIBS = ("-lm",)
_SYMBOL = "paged_decode_attention_f32"


def cache_dir() -> Path:
    configured = os.environ.get("CHATSITE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "chatsite-kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{flags}"


def _library_path(source: bytes) -> Path:
    key = hashlib.sha256()
    for part in (source, COMPILER.encode(), " ".join(CFLAGS + LIBS).encode(), _cpu_signature().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"paged_decode-{key.hexdigest()[:20]}.so"


def _build(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [COMPILER, *CFLAGS, "-o", tmp, str(SOURCE), *LIBS],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{COMPILER} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: readers see no file or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("CHATSITE_CPU_KERNELS", "1") == "0":
        logger.info("CPU decode-attention kernel disabled by CHATSITE_CPU_KERNELS=0")
        return None
    try:
        path = _library_path(SOURCE.read_bytes())
        if not path.is_file():
            _build(path)
        lib = ctypes.CDLL(str(path))
        fn = getattr(lib, _SYMBOL)
    except Exception as exc:  # any failure means "use the PyTorch path"
        logger.warning("CPU decode-attention kernel unavailable (%s); using the PyTorch path", exc)
        return None
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
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
        i32,  # num_threads
    ]
    fn.restype = i32
    return lib


def available() -> bool:
    """True when the kernel is built (or could be built now) and loaded."""
    return _library() is not None


def supports(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether these tensors can go through the kernel: fp32, on the CPU, each cache
    row (``head_dim``) contiguous, and the kernel available."""
    return (
        query.device.type == "cpu"
        and query.dtype == k_cache.dtype == v_cache.dtype == torch.float32
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
) -> torch.Tensor:
    """``query`` ``[B, Hq, D]`` (one new token per sequence, its K/V already stored),
    ``k_cache``/``v_cache`` ``[num_blocks, block_size, Hkv, D]`` (strided views of the
    pool are fine), ``block_tables`` ``[B, W]``, ``context_lens`` ``[B]``. Returns
    ``[B, Hq, D]``. Requires ``supports(query, k_cache, v_cache)``."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the CPU decode-attention kernel is not available")
    num_seqs, q_heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, k_dim = k_cache.shape
    if k_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError("query, k_cache and v_cache disagree on their shapes")
    tables = block_tables if block_tables.dtype == torch.int32 else block_tables.to(torch.int32)
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    if query.stride(-1) != 1:
        query = query.contiguous()
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
        torch.get_num_threads(),
    )
    if rc == 3:
        raise ValueError("a context length exceeds its block table, or a block id is outside the cache")
    if rc != 0:
        raise RuntimeError(f"{_SYMBOL} failed with code {rc}")
    return out
