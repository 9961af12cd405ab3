"""The gated delta rule of one Gated DeltaNet layer at Qwen3-Next's sizes (32 value heads,
Dk = Dv = 128) on the CPU: the C kernel against the PyTorch reference (chunked form for
prefill spans, the batched recurrent form for decode steps), measured in the same run and
printed as ratios.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_gated_delta.py [--heads 32] [--prefill 1024]

On a shared machine the absolute times move with its load: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chatsite_kernels import gated_delta_reference as reference  # noqa: E402
from chatsite_kernels.cpu import gated_delta as cpu_gated_delta  # noqa: E402


def packed_step(lengths: list[int], heads: int, dk: int, dv: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tokens = sum(lengths)
    return {
        "q": reference.l2_normalize(torch.randn(tokens, heads, dk, generator=gen)) * dk**-0.5,
        "k": reference.l2_normalize(torch.randn(tokens, heads, dk, generator=gen)),
        "v": torch.randn(tokens, heads, dv, generator=gen),
        "g": -torch.rand(tokens, heads, generator=gen),
        "beta": torch.rand(tokens, heads, generator=gen),
        "ssm_pool": torch.zeros(len(lengths), heads, dk, dv),
        "slots": torch.arange(len(lengths)),
        "has_initial": torch.ones(len(lengths), dtype=torch.bool),
        "query_start_loc": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
    }


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (and the C kernel's first build)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not cpu_gated_delta.available():
        sys.exit("the C kernel did not build")
    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    cases = {
        f"prefill {args.prefill} tokens": [args.prefill],
        f"decode {args.batch} sequences": [1] * args.batch,
    }
    for name, lengths in cases.items():
        step = packed_step(lengths, args.heads, args.dim, args.dim)
        ref_s = best_of(lambda step=step: reference.gated_delta_varlen(**step), args.repeats)
        c_s = best_of(lambda step=step: cpu_gated_delta.gated_delta_varlen(**step), args.repeats)
        print(f"{name}: reference {ref_s * 1e3:.2f} ms, C {c_s * 1e3:.2f} ms, C is {ref_s / c_s:.2f}x")


if __name__ == "__main__":
    main()
