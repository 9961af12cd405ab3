"""Time to first token of one chat request while one API key floods the engine's queue,
with every request unowned (arrival order: the old behaviour) and with owners (fair
share: round-robin admission across owners), in one process. Then weighted fair share:
two owners with equal loads, at weights 1:1 (the baseline) and 1:3 (a group's scheduler
weight), and the ratio of the tokens each got while both had requests waiting.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_fair_share.py [--model DIR] [--flood 200]

Without --model it builds a tiny random-weight Llama (SmolLM2's tokenizer), so it runs
anywhere in seconds; the ratio, not the absolute time, is the result.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from tests.support.fakes import make_tiny_model_dir


def ttft(engine: LLMEngine, flood: list[list[int]], chat: list[int], owners: bool) -> tuple[float, int]:
    """Seconds and engine steps from the chat request's arrival to its first token."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for prompt in flood:
        engine.add_request(prompt, params, owner="api-key:flood" if owners else None)
    engine.step()  # the flood is running and queued
    start, steps = time.perf_counter(), 0
    request = engine.add_request(chat, params, owner="user:chat" if owners else None)
    while request.first_token_time is None:
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    for request_id in list(engine.requests):
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    engine.block_manager.reset_prefix_cache()
    return elapsed, steps


def weighted_tokens(
    engine: LLMEngine, prompts: list[list[int]], weights: tuple[float, float]
) -> tuple[int, int]:
    """Output tokens the two owners ("a" at weights[0], "b" at weights[1]) got while both
    still had requests waiting; each owner queues the same prompts."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    owner_of: dict[str, str] = {}
    for prompt in prompts:
        for owner, weight in zip("ab", weights, strict=True):
            owner_of[engine.add_request(prompt, params, owner=owner, weight=weight).request_id] = owner
    tokens = {"a": 0, "b": 0}
    while {r.owner for r in engine.scheduler.waiting} == {"a", "b"}:
        for delta in engine.step():
            tokens[owner_of[delta.request_id]] += len(delta.token_ids)
    for request_id in list(engine.requests):
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    engine.block_manager.reset_prefix_cache()
    return tokens["a"], tokens["b"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model directory (default: a tiny random-weight Llama)")
    parser.add_argument("--flood", type=int, default=200, help="requests the API key queues")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args()
    model = args.model or str(make_tiny_model_dir(Path(tempfile.gettempdir()) / "bench-fair-share-tiny"))
    config = EngineConfig(
        model=model,
        device="cpu",
        max_num_seqs=args.max_num_seqs,
        max_waiting=args.flood + 8,
        num_kv_blocks=2048,
    )
    engine = LLMEngine(config, loaded=load_model(model, device="cpu"))
    rng = random.Random(0)
    flood = [[rng.randrange(100, 40000) for _ in range(48)] for _ in range(args.flood)]
    chat = engine.tokenizer.encode_chat([{"role": "user", "content": "Hello! What can you do?"}])
    ttft(engine, flood[:8], chat, owners=False)  # warm-up
    before, before_steps = ttft(engine, flood, chat, owners=False)
    after, after_steps = ttft(engine, flood, chat, owners=True)
    print(f"model: {model}, {args.flood} flood requests, max_num_seqs {args.max_num_seqs}")
    print(f"chat TTFT, arrival order (before): {before * 1000:9.1f} ms  ({before_steps} steps)")
    print(f"chat TTFT, fair share (after):     {after * 1000:9.1f} ms  ({after_steps} steps)")
    print(f"before / after: {before / after:.1f}x")

    weighted = flood[: max(40, args.flood // 4)]
    equal_a, equal_b = weighted_tokens(engine, weighted, (1.0, 1.0))
    light, heavy = weighted_tokens(engine, weighted, (1.0, 3.0))
    print(f"weighted fair share, {len(weighted)} equal requests per owner, max_num_seqs {args.max_num_seqs}:")
    print(f"  weights 1:1 (baseline): tokens {equal_a} : {equal_b}  ratio {equal_b / equal_a:.2f}")
    print(f"  weights 1:3:            tokens {light} : {heavy}  ratio {heavy / light:.2f} (set: 3.00)")


if __name__ == "__main__":
    main()
