"""What a row costs in the quantized products: one decode step's products of
SmolLM2-135M (30 layers of q/k/v, o, fused gate/up and down as Q4 panels, the Q8 LM
head) run on M rows, M = 1 (a decode step) up to a verify step's k + 1 rows.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_quant_rows.py [--threads T] [--rows 1,2,4,...]

Random weights of the model's shapes (30 layers, so the weights come from memory as in a
real step), best of 7 passes, rows interleaved; prints each M's time over M = 1's.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from chatsite_kernels.cpu import quant

HIDDEN, INTER, QKV, LAYERS, VOCAB = 576, 1536, 960, 30, 49152


def random_panels(fmt: str, n: int, k: int) -> quant.PackedQuant:
    g = quant.GROUP[fmt]
    if fmt == "q4":
        q = torch.randint(0, 16, (n, k), dtype=torch.int8)
        return quant.pack(
            quant.QuantRows(fmt, q, torch.rand(n, k // g) * 0.01, -torch.rand(n, k // g) * 0.08)
        )
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    return quant.pack(quant.QuantRows(fmt, q, torch.rand(n, k // g) * 0.01, None))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,4,6,7,8,10,12,13,16,24,32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = [
        [
            random_panels("q4", n, k)
            for n, k in ((QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
        ]
        for _ in range(LAYERS)
    ]
    head = random_panels("q8", VOCAB, HIDDEN)
    rows = [int(m) for m in args.rows.split(",")]
    best: dict[int, tuple[float, float]] = {}
    for _ in range(7):
        for m in rows:
            x, x_inter = torch.randn(m, HIDDEN), torch.randn(m, INTER)
            start = time.perf_counter()
            for qkv, o, gate_up, down in layers:
                quant.linear(x, qkv), quant.linear(x, o), quant.linear(x, gate_up, silu_pairs=True)
                quant.linear(x_inter, down)
            middle = time.perf_counter()
            quant.linear(x, head)
            end = time.perf_counter()
            old = best.get(m, (1e9, 1e9))
            best[m] = (min(old[0], middle - start), min(old[1], end - middle))
    one = sum(best[rows[0]])
    print(f"torch threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    for m in rows:
        layer_s, head_s = best[m]
        print(
            f"M={m:3d}: layers {layer_s * 1e3:6.2f} ms, LM head {head_s * 1e3:5.2f} ms,"
            f" total {(layer_s + head_s) * 1e3:6.2f} ms = {(layer_s + head_s) / one:.2f}x M={rows[0]}"
        )


if __name__ == "__main__":
    main()
