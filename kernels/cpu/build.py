"""Builds the C kernels under ``kernels/cpu/`` with gcc on first use and loads them
with ctypes (no torch headers, no build step at install time).

Build cache: ``$CHATSITE_KERNEL_CACHE`` or ``~/.cache/chatsite-kernels``. A library's
file name is a hash of its source, the compiler command and version, and the CPU
(``-march=native`` code only runs where its instructions exist, and the cache may be
shared between machines). A build goes to a temporary name and is renamed into place,
so processes building at the same time never load a half-written library. Loading a
library marks it used (its access time); a new build removes the builds of the same
library unused for ``PRUNE_AFTER_S`` and stale temporary files.

The cache is code this process will run: a directory that another user owns or can
write to is refused (one warning), and every kernel takes its PyTorch path.

If gcc is missing or a build or load fails, ``load_library`` returns None and logs
one warning; callers then take their PyTorch path. ``CHATSITE_CPU_KERNELS=0`` turns
every C kernel off on purpose (to compare, or to rule them out).

``CHATSITE_KERNEL_ASAN=1`` builds with AddressSanitizer (a separate cache entry). The
Python process must load the ASan runtime first::

    CHATSITE_KERNEL_ASAN=1 ASAN_OPTIONS=detect_leaks=0 \
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) .venv/bin/python -m pytest tests/kernels -k cpu \
    tests/engine/test_decode_stack.py

(``docs/operations.md`` lists the files: every C kernel, the decode stack included.)
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from chatsite_kernels.private_paths import UnsafePathError, ensure_private_dir

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).parent
COMPILER = "gcc"
# No -ffast-math: results must stay within float rounding of the references.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-Wall")
LIBS = ("-lm",)
ASAN_CFLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")
# Libraries built from more than their own source: these are compiled into the same
# shared object, so the first calls the others' exported functions directly.
LINKED = {"decode_stack": ("quant_linear", "linear", "layer_ops", "paged_decode", "lora")}
# Builds of a library not loaded for this long are removed when it is rebuilt.
PRUNE_AFTER_S = 7 * 24 * 3600
STALE_TMP_S = 3600


class UnsafeCacheError(UnsafePathError):
    """The build cache directory could hold libraries planted by another user."""


def cache_dir() -> Path:
    configured = os.environ.get("CHATSITE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "chatsite-kernels"


def enabled() -> bool:
    return os.environ.get("CHATSITE_CPU_KERNELS", "1") != "0"


def asan() -> bool:
    return os.environ.get("CHATSITE_KERNEL_ASAN", "0") not in {"", "0"}


def cflags() -> tuple[str, ...]:
    return CFLAGS + ASAN_CFLAGS if asan() else CFLAGS


@cache
def compiler_version(compiler: str) -> str:
    """The compiler's own description of itself (a new gcc may generate other code)."""
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__})"
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"


def check_cache_dir(path: Path) -> None:
    """Create ``path`` (owner-only) if missing; raise ``UnsafeCacheError`` if another user
    owns it or may write to it (the check the site's data directory and the KV disk tier
    share). Others may still read it: compiled kernels are no secret."""
    try:
        ensure_private_dir(path, tighten=False)
    except UnsafePathError as exc:
        raise UnsafeCacheError(str(exc)) from None


@cache
def _cache_refusal(path: Path) -> str | None:
    """Why ``path`` is refused (warned about once per directory), or None if it is safe."""
    try:
        check_cache_dir(path)
    except (UnsafeCacheError, OSError) as exc:
        logger.warning("CPU kernels off: refusing the build cache %s; using the PyTorch path", exc)
        return str(exc)
    return None


def cpu_signature() -> str:
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


def library_path(name: str, source: bytes) -> Path:
    """Where the build of ``source`` lives: keyed by it, the shared headers it may
    include, the compiler command and the CPU."""
    headers = b"".join(p.read_bytes() for p in sorted(SOURCES.glob("*.h")))
    key = hashlib.sha256()
    for part in (
        source,
        headers,
        COMPILER.encode(),
        compiler_version(COMPILER).encode(),
        " ".join(cflags() + LIBS).encode(),
        cpu_signature().encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"{name}-{key.hexdigest()[:20]}.so"


def sources(name: str) -> list[Path]:
    """The C files library ``name`` is compiled from, its own first."""
    return [SOURCES / f"{part}.c" for part in (name, *LINKED.get(name, ()))]


def build(source: Path | list[Path], target: Path) -> None:
    files = [source] if isinstance(source, Path) else source
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [COMPILER, *cflags(), "-o", tmp, *map(str, files), *LIBS],
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
    prune(target)


def prune(keep: Path, now: float | None = None) -> list[Path]:
    """Remove other builds of ``keep``'s library unused for ``PRUNE_AFTER_S`` (other
    checkouts sharing the cache keep theirs while they use them) and stale temporary
    files. Returns what was removed."""
    now = time.time() if now is None else now
    library = keep.name.rsplit("-", 1)[0]
    removed = []
    for path in keep.parent.glob(f"{library}-*"):
        if path == keep:
            continue
        try:
            info = path.stat()
            stale = path.suffix == ".tmp" and now - info.st_mtime > STALE_TMP_S
            unused = path.suffix == ".so" and now - max(info.st_atime, info.st_mtime) > PRUNE_AFTER_S
            if stale or unused:
                path.unlink()
                removed.append(path)
        except OSError:  # another process removed or replaced it first
            continue
    return removed


def mark_used(path: Path) -> None:
    """Set the access time (not the modification time) to now: this build is in use."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass


@cache
def load_library(name: str, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL | None:
    """``kernels/cpu/<name>.c`` built (once per source, flags and CPU) and loaded, with
    ``declare`` run on it to set its functions' ctypes signatures; None if the kernels
    are disabled or anything fails (logged once per library)."""
    if not enabled():
        logger.info("CPU kernel %s disabled by CHATSITE_CPU_KERNELS=0", name)
        return None
    if _cache_refusal(cache_dir().resolve()) is not None:
        return None
    try:
        files = sources(name)
        path = library_path(name, b"\0".join(f.read_bytes() for f in files))
        if not path.is_file():
            build(files, path)
        else:
            mark_used(path)
        lib = ctypes.CDLL(str(path))
        declare(lib)
    except Exception as exc:  # any failure means "use the PyTorch path"
        logger.warning("CPU kernel %s unavailable (%s); using the PyTorch path", name, exc)
        return None
    return lib


def require(name: str, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """``load_library`` for a caller that has already chosen the kernel path."""
    lib = load_library(name, declare)
    if lib is None:
        raise RuntimeError(f"the CPU kernel {name} is not available")
    return lib


def check(rc: int, symbol: str, bad_index: str | None = None) -> None:
    """The kernels' return codes: 0 ok, 3 an index out of range (``bad_index`` says
    which), anything else a bad call."""
    if rc == 3 and bad_index:
        raise ValueError(bad_index)
    if rc != 0:
        raise RuntimeError(f"{symbol} failed with code {rc}")


def as_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` as ``[M, width]`` rows a kernel can read in place: unit inner stride and a
    row stride of at least ``width`` (a copy only when ``x`` is not already so)."""
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) < width):
        rows = rows.contiguous()
    return rows
