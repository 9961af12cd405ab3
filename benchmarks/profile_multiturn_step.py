"""Where one engine step's time goes with many chats running: the multi-turn workload's steps.

In process, on the default model (SmolLM2-135M-Instruct Q4_1): ``--streams`` requests with
``--history``-token prompts that share a ``--shared``-token system prefix are prefilled, then
decode together. It prints:

- the prefill: steps and seconds for all histories, and how many prompt tokens each step
  carried (with the step budget on, streams already decoding cut the chunks);
- a decode step at M = ``--streams``: its wall time split into the scheduler's planning
  (``Scheduler.schedule`` and ``finish_step``), the model (``ModelRunner.execute``: the
  batched quantized products and the paged attention over every history) and sampling with
  the per-sequence bookkeeping (``LLMEngine._process_samples``), the rest being the step's
  own glue;
- the same for steps that also carry a new turn's prompt (``--turn`` tokens after one
  stream's history), with the step budget's limit on it;
- with ``--cprofile``, the top functions of the decode steps by own time.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_multiturn_step.py [--streams 16]
        [--history 1500] [--steps 20] [--cprofile]

The split is what ``benchmarks/bench_multiturn.py`` cannot show: that one times the site from
outside. The web layer's share is the difference between the two at the same load.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = (
    ("scheduler", "schedule"),
    ("scheduler", "finish_step"),
    ("runner", "execute"),
    ("", "_process_samples"),
)


def timed(spent: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    return wrapper


def instrument(engine: Any) -> dict[str, float]:
    """Wrap the step's parts on their instances; the dict sums each part's seconds."""
    spent: dict[str, float] = defaultdict(float)
    for owner_name, method in PARTS:
        owner = getattr(engine, owner_name) if owner_name else engine
        setattr(owner, method, timed(spent, method, getattr(owner, method)))
    return spent


def measure_steps(engine: Any, spent: dict[str, float], steps: int) -> dict[str, float]:
    spent.clear()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    parts = {name: seconds / steps * 1000 for name, seconds in spent.items()}
    parts["total"] = total / steps * 1000
    parts["glue"] = parts["total"] - sum(v for k, v in parts.items() if k != "total")
    return parts


def show(label: str, parts: dict[str, float]) -> None:
    names = ("schedule", "finish_step", "execute", "_process_samples", "glue")
    split = ", ".join(
        f"{n} {parts.get(n, 0.0):.1f} ({parts.get(n, 0.0) / parts['total']:.0%})" for n in names
    )
    print(f"{label}: {parts['total']:.1f} ms per step; {split}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--history", type=int, default=1500)
    parser.add_argument("--shared", type=int, default=350)
    parser.add_argument("--turn", type=int, default=120, help="a new turn's uncached prompt tokens")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args(argv)

    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.engine.step_budget import count_tokens
    from inference.runner.model_files import default_model_path
    from inference.sampling.params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(default_model_path()), device="cpu"))
    rng = random.Random(0)
    shared = [rng.randrange(1000, 40000) for _ in range(min(args.shared, args.history))]
    answer = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    histories = [
        shared + [rng.randrange(1000, 40000) for _ in range(args.history - len(shared))]
        for _ in range(args.streams)
    ]
    requests = [engine.add_request(history, answer) for history in histories]
    chunks: list[int] = []
    schedule = engine.scheduler.schedule

    def recording() -> Any:
        batch = schedule()
        chunks.append(count_tokens(batch.num_new_tokens)[0])
        return batch

    engine.scheduler.schedule = recording
    start = time.perf_counter()
    while not all(engine.request_output(r).token_ids for r in requests):
        engine.step()
    print(
        f"prefill {args.streams} x {args.history} tokens ({len(shared)} shared): "
        f"{time.perf_counter() - start:.1f} s in {len(chunks)} steps; prompt tokens per step {chunks}"
    )
    engine.scheduler.schedule = schedule
    spent = instrument(engine)
    for _ in range(3):
        engine.step()
    show(f"decode, M={args.streams}", measure_steps(engine, spent, args.steps))

    turn = histories[0] + [rng.randrange(1000, 40000) for _ in range(args.turn)]
    engine.add_request(turn, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    budget = engine.scheduler.step_budget
    limit = budget.prefill_limit(args.streams) if budget is not None else None
    show(f"decode + a {args.turn}-token turn (budget limit {limit})", measure_steps(engine, spent, 3))

    if args.cprofile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            engine.step()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
