"""A hybrid model's next chat turn: time to first token resuming from the saved state at
the end of the previous answer, against recomputing the whole conversation.

A tiny random Qwen3.5 (three Gated DeltaNet layers per full-attention layer, built from
transformers' config class; no weights are downloaded) serves a conversation of about
2,000 tokens: the first turn's prompt, then its answer. The next turn's prompt is that
history plus a new message. It is timed (a one-token generation) three ways, each in the
same run on the same weights:

- ``recompute``: an engine with prefix caching off (the baseline);
- ``saved state``: the engine that served the first turn (its end-of-answer state);
- ``disk after restart``: an engine with a disk tier serves the first turn and is closed;
  a new engine on the same directory (a warm restart: empty pool, saved state and KV
  blocks read from disk) serves the next turn.

It prints the median of ``--repeats`` timings of each and the ratio against the
baseline. On a shared machine the absolute figures move with its load: compare ratios.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_hybrid_chat.py [--history 2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import tempfile
import time

import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.models.registry import build_model, read_model_config
from inference.runner.weights_identity import tag
from inference.sampling.params import SamplingParams
from inference.tokenizer import Tokenizer

VOCAB = 320


def _model() -> tuple[torch.nn.Module, object]:
    import transformers

    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(config).eval()
    ours = build_model(read_model_config(config))
    ours.load_weights(hf.state_dict())
    tag(ours, {"bench": "bench_hybrid_chat", "seed": 0})  # what load_model tags a loaded model with
    model_config = dataclasses.replace(read_model_config(config), name="bench-qwen3_5")
    return ours.eval(), model_config


def _engine(
    model: torch.nn.Module, model_config: object, tokenizer: Tokenizer, caching: bool, disk: str | None = None
) -> LLMEngine:
    config = EngineConfig(device="cpu", num_kv_blocks=512, enable_prefix_caching=caching, kv_disk_dir=disk)
    return LLMEngine(config, loaded=(model, tokenizer, model_config))  # type: ignore[arg-type]


def _run(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, list[int], int]:
    """(seconds to the first token, the tokens, cached prompt tokens)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = engine.add_request(prompt, params)
    started = time.perf_counter()
    first = None
    while engine.has_unfinished():
        engine.step()
        produced = request.finished_seqs or (request.seqs and request.seqs[0].num_output_tokens)
        if first is None and produced:
            first = time.perf_counter() - started
    seq = request.finished_seqs[0]
    assert first is not None
    return first, seq.token_ids[seq.num_prompt_tokens :], request.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=2000, help="tokens before the next turn")
    parser.add_argument("--answer", type=int, default=40, help="tokens of the previous answer")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from tests.support.fakes import smollm2_tokenizer_dir

    torch.set_num_threads(1)
    model, model_config = _model()
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    rng = random.Random(0)
    cached = _engine(model, model_config, tokenizer, caching=True)
    baseline = _engine(model, model_config, tokenizer, caching=False)
    recompute, saved, hits, restarted, disk_hits = [], [], [], [], []
    scratch = tempfile.TemporaryDirectory(prefix="bench-hybrid-disk-")
    for _ in range(args.repeats):  # a new conversation each time: only its answer's end is saved
        first_prompt = [rng.randrange(3, VOCAB) for _ in range(args.history - args.answer)]
        _, answer, _ = _run(cached, first_prompt, args.answer)
        history = first_prompt + answer
        turn = history + [rng.randrange(3, VOCAB) for _ in range(12)]
        t_base, base_tokens, _ = _run(baseline, turn, 1)
        t_saved, saved_tokens, hit = _run(cached, turn, 1)
        assert base_tokens == saved_tokens, "the resumed state gave another token"
        recompute.append(t_base)
        saved.append(t_saved)
        hits.append(hit)
        disk = tempfile.mkdtemp(dir=scratch.name)
        first = _engine(model, model_config, tokenizer, caching=True, disk=disk)
        _, disk_answer, _ = _run(first, first_prompt, args.answer)
        first.close()
        assert disk_answer == answer
        restart = _engine(model, model_config, tokenizer, caching=True, disk=disk)
        t_disk, disk_tokens, disk_hit = _run(restart, turn, 1)
        restart.close()
        assert disk_tokens == base_tokens, "the state restored from disk gave another token"
        restarted.append(t_disk)
        disk_hits.append(disk_hit)
    scratch.cleanup()
    base_s, saved_s = statistics.median(recompute), statistics.median(saved)
    disk_s = statistics.median(restarted)
    load = os.getloadavg()[0]
    print(f"next turn after {len(history)} tokens of history (load average {load:.1f})")
    print(f"  recompute          TTFT {base_s * 1000:8.1f} ms")
    print(
        f"  saved state        TTFT {saved_s * 1000:8.1f} ms  ({min(hits)}-{max(hits)} cached tokens)  {base_s / saved_s:6.1f}x"
    )
    print(
        f"  disk after restart TTFT {disk_s * 1000:8.1f} ms  ({min(disk_hits)}-{max(disk_hits)} cached tokens)  {base_s / disk_s:6.1f}x"
    )


if __name__ == "__main__":
    main()
