"""CPU prefill attention over the paged KV cache: fp32 against bf16 operands (the
attention context's ``cpu_bf16``), same inputs, same run.

    python -m benchmarks.bench_prefill_attention [--chunks 16,54,128,512,2048]
        [--histories 0,1500,3000] [--decodes 4] [--threads N]

One prefill chunk of each size after each cached history (plus ``--decodes`` decoding
sequences over the history, as in a mixed step), SmolLM2's head shape (9 query heads over
3 KV heads, head_dim 64), block 16, shuffled block tables, K/V already stored. Prints the
best time of fp32 and bf16 (taken in turns, so both see the same load), their ratio, and
each path's largest absolute error against ``paged_attention_ref`` (fp32 SDPA, the oracle).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from chatsite_kernels.reference import paged_attention_ref
from inference.layers.attention import paged_attention
from inference.layers.attention_context import AttentionContext

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def make_step(chunk: int, history: int, decodes: int, gen: torch.Generator):
    """(query, key, value, k_cache, v_cache, context) of a step: ``decodes`` one-token
    sequences and one ``chunk``-token prefill, all after ``history`` cached tokens; the
    new tokens' ``key``/``value`` are the ones already in the cache."""
    lens = [history + 1] * decodes + [history + chunk]
    new = [1] * decodes + [chunk]
    per_seq = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(per_seq) + 1
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, width = [], max(per_seq)
    for n in per_seq:
        tables.append(order[:n] + [0] * (width - n))
        order = order[n:]
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    ctx = AttentionContext(
        slot_mapping=torch.empty(0, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        max_query_len=max(new),
        max_context_len=max(lens),
    )
    query = torch.randn(starts[-1], Q_HEADS, HEAD_DIM, generator=gen)
    slots = [
        (table[pos // BLOCK], pos % BLOCK)
        for table, kv_len, n in zip(tables, lens, new, strict=True)
        for pos in range(kv_len - n, kv_len)
    ]
    blocks, offsets = (torch.tensor(x) for x in zip(*slots, strict=True))
    return query, k_cache[blocks, offsets], v_cache[blocks, offsets], k_cache, v_cache, ctx


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: AttentionContext,
) -> Callable[[], torch.Tensor]:
    scale = HEAD_DIM**-0.5
    return lambda: paged_attention(query, key, value, k_cache, v_cache, ctx, scale, kv_stored=True)


def best_times(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    for fn in fns.values():  # warm-up (oneDNN builds its kernels on first use)
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", default="16,54,128,512,2048")
    parser.add_argument("--histories", default="0,1500,3000")
    parser.add_argument("--decodes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--budget-s", type=float, default=0.5, help="time per case and path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    scale = HEAD_DIM**-0.5
    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}, decodes {args.decodes}")
    print(
        f"{'chunk':>6} {'history':>7} {'fp32 ms':>9} {'bf16 ms':>9} {'fp32/bf16':>9} {'err fp32':>9} {'err bf16':>9}"
    )
    for history in (int(h) for h in args.histories.split(",")):
        for chunk in (int(c) for c in args.chunks.split(",")):
            query, key, value, k_cache, v_cache, ctx = make_step(chunk, history, args.decodes, gen)
            fns = {
                "fp32": _attention(query, key, value, k_cache, v_cache, ctx),
                "bf16": _attention(query, key, value, k_cache, v_cache, replace(ctx, cpu_bf16=True)),
            }
            ref = paged_attention_ref(
                query, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, scale
            )
            errs = {name: (fn() - ref).abs().max().item() for name, fn in fns.items()}
            start = time.perf_counter()
            fns["fp32"]()
            rounds = max(3, min(50, int(args.budget_s / max(time.perf_counter() - start, 1e-6))))
            best = best_times(fns, rounds)
            print(
                f"{chunk:6d} {history:7d} {best['fp32'] * 1e3:9.2f} {best['bf16'] * 1e3:9.2f}"
                f" {best['fp32'] / best['bf16']:9.2f} {errs['fp32']:9.1e} {errs['bf16']:9.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
