"""A multi-turn chat's mixed step on the CPU with fp32 against bf16 prefill attention,
same engine, same run, steps taken in turns.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_mixed_step_attention.py
        [--turns 54,128,512] [--history 1500] [--decodes 4] [--repeats 7] [--threads N]

On the default model (SmolLM2-135M-Instruct Q4_1): ``--decodes`` conversations decode
over ``--history``-token prompts while a new turn of each ``--turns`` size arrives after
another cached ``--history``-token conversation (the prefix cache holds its whole blocks,
so the step also carries the history's last partial block). Only prefill attention
changes between the two: the engine's products stay fp32 (``cpu_matmul="fp32"``) and
``prefill_attention_torch`` is called with ``bf16`` on or off, as ``ctx.cpu_bf16`` would.
Prints the median and best step time of each and their ratio, and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", default="54,128,512")
    parser.add_argument("--history", type=int, default=1500)
    parser.add_argument("--decodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args(argv)

    import torch

    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.layers import attention
    from inference.runner.model_files import default_model_path
    from inference.sampling.params import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    config = EngineConfig(model=str(default_model_path()), device="cpu", step_budget_ms=0, cpu_matmul="fp32")
    engine = LLMEngine(config)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 40000) for _ in range(n)]

    decoding = SamplingParams(temperature=0, max_tokens=1_000_000, ignore_eos=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    requests = [engine.add_request(tokens(args.history), decoding) for _ in range(args.decodes)]
    history = tokens(args.history)
    engine.add_request(history, one)  # puts the new turns' history in the prefix cache
    while not all(engine.request_output(r).token_ids for r in requests):
        engine.step()
    for _ in range(3):
        engine.step()

    original = attention.prefill_attention_torch

    def forced(bf16: bool) -> Callable[..., Any]:
        def prefill(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **{**kwargs, "bf16": bf16})  # overrides the context's flag

        return prefill

    paths = {"fp32": forced(False), "bf16": forced(True)}
    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")
    try:
        for turn in (int(t) for t in args.turns.split(",")):
            times: dict[str, list[float]] = {"fp32": [], "bf16": []}
            for repeat in range(args.repeats + 1):  # the first round warms up
                for name, path in paths.items():
                    attention.prefill_attention_torch = path
                    engine.add_request(history + tokens(turn), one)
                    start = time.perf_counter()
                    engine.step()
                    if repeat:
                        times[name].append(time.perf_counter() - start)
                    engine.step()  # the turn's request finishes; back to decodes only
            med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            best = {name: min(t) * 1e3 for name, t in times.items()}
            print(
                f"{args.decodes} decodes + {turn} new tokens after {args.history} cached:"
                f" fp32 {med['fp32']:.1f} ms (best {best['fp32']:.1f}),"
                f" bf16 {med['bf16']:.1f} ms (best {best['bf16']:.1f}),"
                f" fp32/bf16 {med['fp32'] / med['bf16']:.2f}; load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    finally:
        attention.prefill_attention_torch = original


if __name__ == "__main__":
    main()
