"""The KV host tier on a real GPU: the checks that could not run where it was written.

    python -m tools.gpu_check.gpu_check_kv_tiers [--model DIR]

1. Round trip: blocks offloaded to pinned memory on the side stream while the compute
   stream keeps writing other blocks, then loaded back into fresh blocks: bit-equal.
2. Bandwidth: device -> pinned host and back, GB/s (the cost model's host figure).
3. Engine: greedy tokens with a pool too small for the workload and ``kv_cpu_gb`` set
   equal those of a roomy pool; host-tier hits and swaps are printed.
Exits 0 with "no CUDA device" elsewhere.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from inference.kv.host import HostTier


def round_trip(device: torch.device) -> str:
    pool = torch.randn(64, 2, 30, 16, 3, 64, device=device, dtype=torch.bfloat16)
    expected = pool[:32].clone()
    host = HostTier(pool, 40 * pool[0].numel() * pool.element_size())
    for b in range(32):
        host.store(1000 + b, 0, (b,), b)
    host.before_forward()
    pool[:32].normal_()  # the compute stream overwrites the offloaded blocks right after
    for b in range(32):
        host.load(1000 + b, 32 + b)
    host.before_forward()
    torch.cuda.synchronize(device)
    ok = torch.equal(pool[32:], expected)
    return f"round trip of 32 blocks through pinned memory: {'equal' if ok else 'MISMATCH'}"


def bandwidth(device: torch.device) -> str:
    block = torch.empty(256, 2, 30, 16, 3, 64, device=device, dtype=torch.bfloat16)
    pinned = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
    nbytes = block.numel() * block.element_size()
    rates = []
    for dst, src in ((pinned, block), (block, pinned)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        rates.append(10 * nbytes / (time.perf_counter() - start) / 1e9)
    return f"device->host {rates[0]:.1f} GB/s, host->device {rates[1]:.1f} GB/s"


def engine_check(model: str | None) -> str:
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.runner.model_loader import load_model
    from inference.sampling.params import SamplingParams

    loaded = load_model(model, device="cuda")
    prompts = [[(i * 31 + j * 7) % 30000 + 100 for j in range(200 + 37 * i)] for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

    def run(**kw) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(EngineConfig(model=model, device="cuda", **kw), loaded=loaded)
        requests = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        return [engine.request_output(r).token_ids for r in requests], engine

    roomy, _ = run(num_kv_blocks=1024)
    tight, engine = run(num_kv_blocks=80, kv_cpu_gb=0.5)
    stats = engine.stats()
    same = sum(a == b for a, b in zip(roomy, tight, strict=True))
    return (
        f"greedy with a tight pool + host tier: {same}/{len(prompts)} equal to a roomy pool; "
        f"preemptions {stats.num_preemptions}, swaps {stats.num_swaps}, host {stats.kv_tiers.get('host')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model for the engine check (default: SmolLM2-135M)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device = torch.device("cuda")
    for check in (round_trip, bandwidth):
        print(check(device), flush=True)
    print(engine_check(args.model), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
