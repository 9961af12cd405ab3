"""Times chatsite_kernels.cpu.linear (packed weights) against torch's BLAS for the default
model's shapes, decode-sized to prefill-sized.

    python benchmarks/bench_cpu_linear.py

Each shape cycles through 30 weight matrices (the model's layer count), so weights
come from memory as in a real decode step, not from cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from chatsite_kernels.cpu.linear import linear_packed, pack_weight

SHAPES = {"q/o 576x576": (576, 576), "gate/up 1536x576": (1536, 576), "down 576x1536": (576, 1536),
          "k/v 192x576": (192, 576), "lm_head 49152x576": (49152, 576)}  # fmt: skip


def per_call(fn: Callable[..., object], x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    for w in weights:
        fn(x, w)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.4:
        for w in weights:
            fn(x, w)
        reps += 1
    return (time.perf_counter() - start) / reps / len(weights)


def main() -> None:
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"{'shape':>18} {'rows':>5} {'torch us':>9} {'ours us':>9} {'speed-up':>8} {'ours GFLOP/s':>12}")
    for label, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k) for _ in range(30 if n < 10_000 else 2)]
        packed = [pack_weight(w) for w in weights]
        for rows in (1, 4, 16, 64, 256, 2048):
            if n > 10_000 and rows > 256:
                continue  # the LM head only sees sampled rows
            x = torch.randn(rows, k)
            torch.testing.assert_close(
                linear_packed(x, packed[0], n), F.linear(x, weights[0]), rtol=1e-4, atol=1e-3
            )
            theirs = per_call(F.linear, x, weights)
            ours = per_call(partial(linear_packed, out_features=n), x, packed)
            print(
                f"{label:>18} {rows:5d} {theirs * 1e6:9.1f} {ours * 1e6:9.1f} {theirs / ours:8.2f}"
                f" {2 * rows * n * k / ours / 1e9:12.1f}"
            )


if __name__ == "__main__":
    main()
