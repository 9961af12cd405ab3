"""Benchmark part (used by ``benchmarks.bench``): the timed runs. Our engine on the
throughput and multi-turn workloads, and the transformers ``generate()`` baseline on
the same throughput workload, one request at a time and in static left-padded batches.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from benchmarks.bench_workload import WORDS, Workload
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams

# ---- our engine ---------------------------------------------------------------------------


def run_ours_throughput(engine: LLMEngine, workload: Workload) -> dict[str, Any]:
    engine.block_manager.reset_prefix_cache()
    engine.metrics.peak_kv_blocks_used, engine.metrics.kv_waste_at_peak = 0, 0.0
    start = time.perf_counter()
    requests = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        for p, n in zip(workload.prompts, workload.output_lens, strict=True)
    ]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    produced = sum(len(engine.request_output(r).token_ids) for r in requests)
    assert produced == workload.output_tokens, (produced, workload.output_tokens)
    return {
        "seconds": elapsed,
        "output_tokens": produced,
        "tokens_per_s": produced / elapsed,
        "steps": steps,
        "preemptions": engine.scheduler.num_preemptions,
        "peak_kv_blocks_used": engine.metrics.peak_kv_blocks_used,
        "kv_waste_at_peak": engine.metrics.kv_waste_at_peak,
    }


def run_multi_turn(engine: LLMEngine, conversations: int, turns: int, answer_tokens: int) -> dict[str, Any]:
    """All conversations send turn k together; each turn's prompt extends the previous
    turn's prompt + answer ids exactly (stored token ids, never re-tokenised text)."""
    tok = engine.tokenizer
    rng = random.Random(1)
    engine.block_manager.reset_prefix_cache()
    histories: list[list[dict[str, Any]]] = [[] for _ in range(conversations)]
    previous: list[list[int]] = [[] for _ in range(conversations)]
    ttft_by_turn: list[float] = []
    hit_tokens = history_tokens = 0
    for turn in range(turns):
        requests = []
        for c in range(conversations):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30)))
            histories[c].append({"role": "user", "content": f"Turn {turn + 1}: {question}?"})
            prompt = tok.encode_chat(histories[c])
            if turn:
                assert prompt[: len(previous[c])] == previous[c], "history must be a token prefix"
                history_tokens += len(previous[c])
            params = SamplingParams(temperature=0, max_tokens=answer_tokens, ignore_eos=True)
            requests.append((c, prompt, engine.add_request(prompt, params)))
        while engine.has_unfinished():
            engine.step()
        ttfts = []
        for c, prompt, request in requests:
            out = engine.request_output(request)
            ttfts.append(request.first_token_time - request.arrival_time)
            if turn:
                hit_tokens += request.num_cached_tokens
            histories[c].append({"role": "assistant", "content": out.text, "token_ids": out.token_ids})
            previous[c] = prompt + out.token_ids
        ttft_by_turn.append(statistics.mean(ttfts))
    return {
        "conversations": conversations,
        "turns": turns,
        "hit_rate": hit_tokens / history_tokens if history_tokens else 0.0,
        "hit_tokens": hit_tokens,
        "history_tokens": history_tokens,
        "ttft_ms_by_turn": [t * 1000 for t in ttft_by_turn],
        "ttft_turn_last_over_first": ttft_by_turn[-1] / ttft_by_turn[0],
    }


# ---- the transformers baseline ---------------------------------------------------------------


def hf_generate(hf: Any, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> None:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=None,
        )


def run_hf_sequential(hf: Any, workload: Workload, indices: list[int], pad_id: int) -> dict[str, Any]:
    start = time.perf_counter()
    for i in indices:
        hf_generate(hf, [workload.prompts[i]], workload.output_lens[i], pad_id)
    elapsed = time.perf_counter() - start
    tokens = sum(workload.output_lens[i] for i in indices)
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "requests_measured": len(indices),
        "requests_total": len(workload.prompts),
    }


def run_hf_static(
    hf: Any, workload: Workload, batch_size: int, batches: list[int], pad_id: int
) -> dict[str, Any]:
    start = time.perf_counter()
    tokens = 0
    for b in batches:
        idx = range(b * batch_size, min((b + 1) * batch_size, len(workload.prompts)))
        lens = [workload.output_lens[i] for i in idx]
        hf_generate(hf, [workload.prompts[i] for i in idx], max(lens), pad_id)
        tokens += sum(lens)  # useful tokens; the padding steps past each one's length are waste
    elapsed = time.perf_counter() - start
    total_batches = -(-len(workload.prompts) // batch_size)
    return {
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "batches_measured": len(batches),
        "batches_total": total_batches,
        "batch_size": batch_size,
    }
