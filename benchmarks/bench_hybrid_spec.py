"""Speculative decoding on a hybrid model: decode speed with n-gram proposals against
plain decoding, on the same weights in the same run.

The tiny random Qwen3.5 of ``bench_hybrid_chat`` (8 layers, three Gated DeltaNet per
full-attention layer, hidden 256) answers prompts that repeat a passage, so the n-gram
speculator finds proposals in the prompt. Each engine generates the same greedy tokens
(checked); a verification runs the recurrent layers over the proposal as one span and, on
a rejection, restores the state from before the step and recomputes the accepted tokens.
Printed: median decode tokens per second of each, the ratio against plain decoding, the
acceptance figures and the load average. On a shared machine compare ratios.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_hybrid_spec.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from benchmarks.bench_hybrid_chat import VOCAB, _model
from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams
from inference.tokenizer import Tokenizer


def _engine(
    model: torch.nn.Module, model_config: object, tokenizer: Tokenizer, spec: str | None
) -> LLMEngine:
    config = EngineConfig(device="cpu", num_kv_blocks=512, speculative=spec, enable_prefix_caching=False)
    return LLMEngine(config, loaded=(model, tokenizer, model_config))  # type: ignore[arg-type]


def _decode(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, list[int]]:
    """Seconds from the first generated token to the last, and the tokens."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = engine.add_request(prompt, params)
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and request.seqs and request.seqs[0].num_output_tokens > 0:
            first = time.perf_counter()
    assert first is not None
    tokens = engine.request_output(request).outputs[0].token_ids
    return time.perf_counter() - first, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from tests.support.fakes import smollm2_tokenizer_dir

    model, model_config = _model()
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    rng = random.Random(1)
    passage = [rng.randrange(3, VOCAB) for _ in range(40)]
    plain = _engine(model, model_config, tokenizer, None)
    # The model's own continuation of the passage, quoted back: what it answers next is in the prompt.
    answer = _decode(plain, passage, 60)[1]
    prompt = passage + answer + passage
    spec = _engine(model, model_config, tokenizer, "ngram")
    times: dict[str, list[float]] = {"plain": [], "ngram": []}
    outputs: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for name, engine in (("plain", plain), ("ngram", spec)):
            seconds, tokens = _decode(engine, prompt, args.tokens)
            times[name].append(seconds)
            outputs[name] = tokens
    assert outputs["plain"] == outputs["ngram"], "speculation changed the greedy tokens"
    rate = {k: (args.tokens - 1) / statistics.median(v) for k, v in times.items()}
    stats = spec.speculator.stats
    print(f"load average {os.getloadavg()}")
    print(f"prompt {len(prompt)} tokens, {args.tokens} generated, {args.repeats} repeats (median)")
    print(f"plain decoding:       {rate['plain']:8.1f} tok/s")
    print(f"n-gram speculation:   {rate['ngram']:8.1f} tok/s  ratio {rate['ngram'] / rate['plain']:.2f}x")
    print(
        f"proposed {stats.proposed_tokens}, accepted {stats.accepted_tokens} "
        f"({stats.acceptance_rate:.0%}), rejected {stats.rejected_tokens}, rollbacks {stats.rollbacks}"
    )


if __name__ == "__main__":
    main()
