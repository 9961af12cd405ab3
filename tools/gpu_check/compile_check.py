"""Compile every Triton kernel variant the launchers produce for a CUDA target,
on a machine without a GPU (``python -m tools.gpu_check.compile_check``).

The interpreter (``TRITON_INTERPRET=1``) checks numerics on CPU but skips the
compiler, so it misses errors that only compiling finds: non-constexpr globals,
loop-carried type changes, unsupported ops for 16-bit types, shared-memory
overflow. This runs each launcher on small CPU tensors with the kernels swapped
for recorders, turns the recorded arguments into a signature, switches the dot
operand type to the 16-bit one the launcher would pick on CUDA, and compiles the
result down to a cubin with the ptxas bundled in the triton wheel.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Launch:
    kernel: Any  # the triton JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    label: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` is recorded, not run."""

    def __init__(self, kernel: Any, sink: list[Launch], label: str) -> None:
        self.kernel, self.sink, self.label = kernel, sink, label

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.sink.append(Launch(self.kernel, args, kwargs, self.label))

        return launch


_TORCH_TO_SIG = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
}


def _tl_dtype(dtype: torch.dtype) -> Any:
    import triton.language as tl

    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


@contextlib.contextmanager
def recording(sink: list[Launch], dot_dtype: torch.dtype) -> Iterator[None]:
    """Swap every kernel for a recorder, and make the launchers pick ``dot_dtype``'s
    operands as they would on CUDA (on CPU they fall back to fp32)."""
    from chatsite_kernels.triton import launch as _launch
    from chatsite_kernels.triton import paged_decode, paged_prefill, rmsnorm, rotary, store_kv

    swaps: list[tuple[Any, str, Any]] = []
    for module, name in [
        (store_kv, "_store_kv_kernel"),
        (paged_decode, "_decode_kernel"),
        (paged_decode, "_merge_kernel"),
        (paged_prefill, "_prefill_kernel"),
        (rmsnorm, "_add_rms_norm_kernel"),
        (rotary, "_rotary_kernel"),
    ]:
        swaps.append((module, name, getattr(module, name)))
        setattr(module, name, _Recorder(getattr(module, name), sink, name.strip("_")))
    comp = _tl_dtype(dot_dtype)
    for module in (paged_decode, paged_prefill):
        swaps.append((module, "compute_dtype", module.compute_dtype))
        module.compute_dtype = lambda _t, comp=comp: comp
    swaps.append((_launch, "num_sms", _launch.num_sms))
    try:
        yield
    finally:
        for module, name, original in swaps:
            setattr(module, name, original)


def signature_of(launch: Launch) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    fn = launch.kernel
    names = list(fn.arg_names)
    sig: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    values = dict(zip(names, launch.args, strict=False))
    options = {}
    for key, value in launch.kwargs.items():
        if key in names:
            values[key] = value
        else:
            options[key] = value  # num_warps / num_stages
    constexpr_names = {fn.arg_names[p.num] for p in fn.params if p.is_constexpr}
    for name in names:
        value = values[name]
        if name in constexpr_names:
            sig[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + _TORCH_TO_SIG[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {name}={value!r}")
    return sig, constexprs, options


def record_all(
    dtype: torch.dtype, head_dim: int, q_heads: int, kv_heads: int, block_size: int
) -> list[Launch]:
    """Run every launcher once with shapes like the engine's, recording the launches."""
    from chatsite_kernels.triton import ops as triton_ops

    sink: list[Launch] = []
    with recording(sink, dtype):
        num_blocks, max_blocks = 8, 64  # wide tables, so num_splits=3 really splits
        pool = torch.zeros(num_blocks, 2, 2, block_size, kv_heads, head_dim, dtype=dtype)
        k_cache, v_cache = pool[:, 0, 1], pool[:, 1, 1]
        tables = torch.zeros(3, max_blocks, dtype=torch.int32)
        lens = torch.ones(3, dtype=torch.int32)
        qkv = torch.zeros(5, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype)
        q = qkv[:, : q_heads * head_dim].view(5, q_heads, head_dim)
        k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(5, kv_heads, head_dim)
        triton_ops.store_kv(k, k, k_cache, v_cache, torch.zeros(5, dtype=torch.int64))
        for splits in (1, 3):
            triton_ops.paged_decode_attention(q[:3], k_cache, v_cache, tables, lens, 0.125, num_splits=splits)
        qsl = torch.tensor([0, 1, 3, 5], dtype=torch.int32)
        triton_ops.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, lens, 0.125)
        triton_ops.rotary_embedding_(q, k, torch.zeros(5, dtype=torch.int64), torch.zeros(64, head_dim))
    for launch in sink:
        launch.label += (
            f" {str(dtype).removeprefix('torch.')} Hq{q_heads}/Hkv{kv_heads} D{head_dim} bs{block_size}"
        )
    return sink


def record_norms(dtype: torch.dtype) -> list[Launch]:
    from chatsite_kernels.triton import ops as triton_ops

    sink: list[Launch] = []
    with recording(sink, dtype):
        for hidden in (576, 2048, 4096):
            x = torch.zeros(3, hidden, dtype=dtype)
            triton_ops.fused_add_rms_norm(x, x, torch.ones(hidden, dtype=dtype), 1e-5)
            triton_ops.fused_add_rms_norm(x, None, torch.ones(hidden, dtype=dtype), 1e-5)
    for launch in sink:
        launch.label += f" {str(dtype).removeprefix('torch.')}"
    return sink


SHAPES = [  # (q_heads, kv_heads, head_dim, block_size)
    (9, 3, 64, 16),  # SmolLM2-135M
    (32, 8, 64, 16),  # Llama-3.2-1B
    (32, 8, 128, 32),  # Llama-3-8B-like, bigger block
    (8, 8, 128, 16),  # no GQA
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", type=int, nargs="+", default=[90], help="CUDA compute capabilities, e.g. 80 90"
    )
    parser.add_argument("--quick", action="store_true", help="bf16 and the SmolLM2 shape only")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check needs TRITON_INTERPRET unset (the interpreter has no compiler)", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float16, torch.float32]
    shapes = SHAPES[:1] if args.quick else SHAPES
    launches: list[Launch] = []
    for dtype in dtypes:
        for q_heads, kv_heads, head_dim, block_size in shapes:
            launches += record_all(dtype, head_dim, q_heads, kv_heads, block_size)
        launches += record_norms(dtype)

    failures = 0
    seen: set[str] = set()
    for arch in args.arch:
        target = GPUTarget("cuda", arch, 32)
        for launch in launches:
            sig, constexprs, options = signature_of(launch)
            key = (
                f"{arch}:{launch.kernel.__name__}:{sorted(sig.items())}:{sorted(constexprs.items(), key=str)}"
            )
            if key in seen:
                continue
            seen.add(key)
            start = time.perf_counter()
            try:
                compiled = triton.compile(
                    ASTSource(launch.kernel, sig, constexprs=constexprs), target=target, options=options
                )
            except Exception as exc:  # report every failing variant, not just the first
                failures += 1
                print(f"FAIL sm_{arch} {launch.label}: {type(exc).__name__}: {exc}")
                continue
            print(
                f"ok   sm_{arch} {launch.label:<48} shared={compiled.metadata.shared:>6}B "
                f"warps={compiled.metadata.num_warps} {time.perf_counter() - start:5.1f}s"
            )
    print(f"{len(seen)} variants compiled, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
