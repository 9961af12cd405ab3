"""Decode attention of sliding-window layers on the CPU: the C kernel with the window,
sinks and soft-cap as parameters against the PyTorch path it replaced
(``feature_attention_torch``), same inputs, same run.

    python -m benchmarks.bench_window_attention [--seqs 8] [--context 2000] [--window 512]

SmolLM2's head shape (9 query heads over 3 KV heads, head_dim 64), block 16, shuffled
block tables; each sequence's blocks before its window are ids outside the cache, as a
sliding KV group leaves them. Prints the median time of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from chatsite_kernels.cpu import decode as cpu_decode
from inference.layers.window_attention import AttentionFeatures, feature_attention_torch

OUTSIDE = 1 << 30


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (builds the kernel on first use)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--context", type=int, default=2000)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if not cpu_decode.available():
        raise SystemExit("the C decode kernel did not build (is gcc installed?)")
    gen = torch.Generator().manual_seed(0)
    q_heads, kv_heads, head_dim, block = 9, 3, 64, 16
    per_seq = -(-args.context // block)
    num_blocks = args.seqs * per_seq + 4
    k_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen)[: args.seqs * per_seq].view(args.seqs, per_seq).int()
    tables[:, : max(0, args.context - args.window) // block] = OUTSIDE
    lens = torch.full((args.seqs,), args.context, dtype=torch.int32)
    query = torch.randn(args.seqs, q_heads, head_dim, generator=gen)
    starts = torch.arange(args.seqs + 1, dtype=torch.int32)
    scale = head_dim**-0.5
    features = AttentionFeatures(window=args.window, softcap=50.0, sinks=torch.randn(q_heads, generator=gen))

    def kernel() -> torch.Tensor:
        return cpu_decode.paged_decode_attention_cpu(
            query, k_cache, v_cache, tables, lens, scale,
            window=features.window, softcap=features.softcap, sinks=features.sinks,
        )  # fmt: skip

    def torch_path() -> torch.Tensor:
        return feature_attention_torch(query, k_cache, v_cache, tables, starts, lens, scale, features)

    err = (kernel() - torch_path()).abs().max().item()
    c_s, torch_s = _median_s(kernel, args.repeats), _median_s(torch_path, args.repeats)
    print(
        f"{args.seqs} sequences of {args.context} tokens, window {args.window}, sinks and soft-cap, "
        f"{torch.get_num_threads()} threads (max abs difference {err:.1e})"
    )
    print(f"PyTorch path {torch_s * 1e3:.3f} ms, C kernel {c_s * 1e3:.3f} ms: {torch_s / c_s:.2f}x faster")


if __name__ == "__main__":
    main()
