"""fp32 against bf16 (``EngineConfig.cpu_matmul``) for the CPU's many-row products, in one run.

In process, on the default model (SmolLM2-135M-Instruct Q4_1), one engine per policy (each
with its own copy of the model), measured alternately so both see the same machine load:

- prefill: seconds to the first token of a ``--prompt``-token prompt, and tokens/s;
- mixed steps: ``--decodes`` sequences decoding over ``--history``-token histories while a
  new turn brings N uncached tokens after the first history (N in ``--turns``): the step's
  milliseconds (the step budget is off, so each turn is one step);
- products: one layer's four products (q/k/v, o, gate/up with its SiLU, down) at M rows
  (``--product-rows``) on the quantized kernel against bf16 copies, which sets ``min_rows``;
- many-row decode: a decode step of M sequences (M in ``--decode-rows``, over
  ``--decode-history``-token prompts) through the one-call fp32 C decode stack against the
  per-op path, whose products are bf16 from ``min_rows`` rows on.

Each number is the best of ``--repeats`` tries (the machine may be shared: the best is the
least disturbed); ratios are fp32 / bf16 (or stack / per-op).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cpu_matmul.py [--turns 54 128 512]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POLICIES = ("fp32", "bf16")


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def best_ms(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats)) * 1000


def build(policy: str, max_num_seqs: int = 64) -> Any:
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.runner.model_files import default_model_path

    config = EngineConfig(
        model=str(default_model_path()), device="cpu", cpu_matmul=policy, step_budget_ms=0,
        max_num_seqs=max_num_seqs,
    )  # fmt: skip
    return LLMEngine(config)


def run_until_first_token(engine: Any, prompt: list[int]) -> float:
    from inference.sampling.params import SamplingParams

    start = time.perf_counter()
    request = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while not engine.request_output(request).token_ids:
        engine.step()
    seconds = time.perf_counter() - start
    while engine.has_unfinished() and engine.request_output(request).finish_reason is None:
        engine.step()
    return seconds


def start_decoding(engine: Any, prompts: list[list[int]]) -> list[Any]:
    from inference.sampling.params import SamplingParams

    answer = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)
    requests = [engine.add_request(p, answer) for p in prompts]
    while not all(engine.request_output(r).token_ids for r in requests):
        engine.step()
    return requests


def prefill(engines: dict[str, Any], args: argparse.Namespace) -> None:
    rng = random.Random(1)
    prompts = [tokens(rng, args.prompt) for _ in range(args.repeats)]  # new each time: no cache hits
    ms: dict[str, list[float]] = {p: [] for p in POLICIES}
    for prompt in prompts:
        for policy in POLICIES:
            ms[policy].append(run_until_first_token(engines[policy], prompt) * 1000)
    fp32, bf16 = min(ms["fp32"]), min(ms["bf16"])
    print(
        f"prefill {args.prompt} tokens: fp32 {fp32:.0f} ms ({args.prompt / fp32 * 1000:.0f} tok/s), "
        f"bf16 {bf16:.0f} ms ({args.prompt / bf16 * 1000:.0f} tok/s); fp32/bf16 {fp32 / bf16:.2f}"
    )


def mixed_steps(engines: dict[str, Any], args: argparse.Namespace) -> None:
    rng = random.Random(2)
    histories = [tokens(rng, args.history) for _ in range(args.decodes)]
    for policy in POLICIES:
        start_decoding(engines[policy], histories)
    for n in args.turns:
        ms: dict[str, list[float]] = {p: [] for p in POLICIES}
        for _ in range(args.repeats):
            turn = histories[0] + tokens(rng, n)  # the history's blocks are cached
            for policy in POLICIES:
                engine = engines[policy]
                engine.step()  # a plain decode step first, so the timed one starts clean
                ms[policy].append(run_until_first_token(engine, turn) * 1000)
        fp32, bf16 = min(ms["fp32"]), min(ms["bf16"])
        print(
            f"{args.decodes} decodes + {n} new tokens on a {args.history}-token history: "
            f"fp32 {fp32:.1f} ms, bf16 {bf16:.1f} ms; fp32/bf16 {fp32 / bf16:.2f}"
        )


def products(args: argparse.Namespace) -> None:
    import torch

    from inference.layers import bf16_weights
    from inference.layers.cpu_matmul import CpuMatmul

    engine = build("fp32")
    layer = engine.runner.model.model.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    hidden = mlp.down_proj.out_features

    def layer_products(x: torch.Tensor) -> None:
        attention.fused_qkv(x)
        attention.o_proj(x)
        mlp.forward(x)  # gate/up with the SiLU, then down

    with torch.inference_mode():
        for rows in args.product_rows:
            x = torch.randn(rows, hidden)
            ms = {}
            for policy in POLICIES:
                bf16_weights.attach(layer, CpuMatmul(bf16=policy == "bf16", min_rows=1))
                layer_products(x)

                def once(x: torch.Tensor = x) -> float:
                    start = time.perf_counter()
                    for _ in range(10):
                        layer_products(x)
                    return (time.perf_counter() - start) / 10

                ms[policy] = best_ms(once, args.repeats)
            print(
                f"one layer's products, M={rows}: quantized kernel {ms['fp32']:.3f} ms, "
                f"bf16 {ms['bf16']:.3f} ms; ratio {ms['fp32'] / ms['bf16']:.2f}"
            )


def decode_rows(args: argparse.Namespace) -> None:
    """The bf16 engine's model with and without its one-call decode stack."""
    engine = build("bf16")
    model = engine.runner.model
    stack = model.decode_stack
    rng = random.Random(3)
    for rows in args.decode_rows:
        requests = start_decoding(engine, [tokens(rng, args.decode_history) for _ in range(rows)])
        timings: dict[str, list[float]] = {"stack": [], "per-op": []}
        for _ in range(args.repeats):
            for name, chosen in (("stack", stack), ("per-op", None)):
                model.decode_stack = chosen
                engine.step()
                start = time.perf_counter()
                for _ in range(args.decode_steps):
                    engine.step()
                timings[name].append((time.perf_counter() - start) / args.decode_steps * 1000)
        model.decode_stack = stack
        for request in requests:
            engine.abort(request.request_id)
        engine.step()  # hands the aborted requests' blocks back
        c, e = min(timings["stack"]), min(timings["per-op"])
        print(
            f"decode step, M={rows} over {args.decode_history}-token prompts: fp32 C decode stack "
            f"{c:.1f} ms, per-op path with bf16 products {e:.1f} ms; stack/per-op {c / e:.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--history", type=int, default=1500)
    parser.add_argument("--decodes", type=int, default=4)
    parser.add_argument("--turns", type=int, nargs="*", default=[16, 54, 128, 512])
    parser.add_argument("--product-rows", type=int, nargs="*", default=[1, 4, 8, 12, 16, 24, 32, 54, 128])
    parser.add_argument("--decode-rows", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--decode-history", type=int, default=500)
    parser.add_argument("--decode-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch's CPU threads (0: as the engine sets them)"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["products", "prefill", "mixed", "decode"])
    args = parser.parse_args(argv)

    import torch

    from inference.layers.cpu_matmul import has_amx_bf16

    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"threads {torch.get_num_threads()}, AMX-BF16 {has_amx_bf16()}, load average {os.getloadavg()}")
    if "products" not in args.skip:
        products(args)
    if "prefill" not in args.skip or "mixed" not in args.skip:
        engines = {policy: build(policy) for policy in POLICIES}
        for engine in engines.values():  # first calls (thread pools, oneDNN's kernels) untimed
            run_until_first_token(engine, tokens(random.Random(0), 64))
        if "prefill" not in args.skip:
            prefill(engines, args)
        if "mixed" not in args.skip:
            mixed_steps(engines, args)
        del engines
    if "decode" not in args.skip:
        decode_rows(args)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
