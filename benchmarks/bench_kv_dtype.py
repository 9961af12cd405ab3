"""Decode attention on the CPU over an fp32 against a float16 KV cache: the C kernel
(``chatsite_kernels.cpu.decode``) for every layer of one decode step, same pool
values, same run.

    python -m benchmarks.bench_kv_dtype [--shapes 4x1500 16x1000] [--layers 30] [--repeats 5] [--threads N]

SmolLM2's head shape (9 query heads over 3 KV heads, head_dim 64), block 16, one pool
``[blocks, 2, layers, 16, 3, 64]`` read through each layer's strided views, shuffled
block tables. Long histories make the step bound by the K/V bytes it reads, which a
float16 cache halves. Prints the best of ``--repeats`` step times of each and their
ratio, and the largest difference between the two outputs (the float16 cache holds the
fp32 values rounded once).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from chatsite_kernels.cpu import decode as cpu_decode

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def _best_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (builds the kernel on first use, faults the pool's pages in)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _shape(text: str) -> tuple[int, int]:
    seqs, _, context = text.partition("x")
    return int(seqs), int(context)


def run(seqs: int, context: int, layers: int, repeats: int) -> dict[str, float]:
    """Times of one decode step's attention over ``layers`` layers for each cache dtype."""
    gen = torch.Generator().manual_seed(0)
    per_seq = -(-context // BLOCK)
    num_blocks = seqs * per_seq + 4
    pool32 = torch.randn(num_blocks, 2, layers, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    pool16 = pool32.half()
    tables = torch.randperm(num_blocks, generator=gen)[: seqs * per_seq].view(seqs, per_seq).int()
    lens = torch.full((seqs,), context, dtype=torch.int32)
    query = torch.randn(seqs, Q_HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM**-0.5

    def step(pool: torch.Tensor) -> list[torch.Tensor]:
        return [
            cpu_decode.paged_decode_attention_cpu(query, pool[:, 0, i], pool[:, 1, i], tables, lens, scale)
            for i in range(layers)
        ]

    diff = (step(pool32)[0] - step(pool16)[0]).abs().max().item()
    result = {"fp32_ms": 1e3 * _best_s(lambda: step(pool32), repeats)}
    result["fp16_ms"] = 1e3 * _best_s(lambda: step(pool16), repeats)
    result["max_diff"] = diff
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", type=_shape, default=[(4, 1500), (16, 1000)], metavar="SEQSxTOKENS"
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch's intra-op threads (default: as set)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_decode.available():
        raise SystemExit("the C decode kernel did not build (is gcc installed?)")
    print(f"threads {torch.get_num_threads()}, {args.layers} layers, best of {args.repeats}")
    for seqs, context in args.shapes:
        r = run(seqs, context, args.layers, args.repeats)
        print(
            f"{seqs:>3} seqs x {context:>5} tokens: fp32 {r['fp32_ms']:7.2f} ms  float16 {r['fp16_ms']:7.2f} ms"
            f"  ratio {r['fp32_ms'] / r['fp16_ms']:.2f}x  max |diff| {r['max_diff']:.1e}"
        )


if __name__ == "__main__":
    main()
