"""A decode batch mixing two LoRA adapters and the base model against the base model alone,
at the same batch size, on the same engine (the default SmolLM2 model unless --model).

Each run adds ``--batch`` requests of random prompts at once and decodes ``--tokens`` greedy
tokens each (EOS ignored); tokens/s counts the generated tokens over the steps after the
first token of every request (decode steps: the prefill is the same work in both runs).
The adapters are random PEFT-format adapters of rank ``--rank`` on every projection, written
to a temporary directory (speed does not depend on their values).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_lora.py [--batch 12] [--tokens 48] [--rank 16]

Printed only; no figure is asserted. A shared machine makes the seconds noisy: runs
alternate and the best of ``--runs`` is kept for each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from inference.config import EngineConfig  # noqa: E402
from inference.engine.llm_engine import LLMEngine  # noqa: E402
from inference.lora import load_peft_adapter  # noqa: E402
from inference.lora.adapter import PROJECTIONS  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402


def write_adapter(engine: LLMEngine, path: Path, rank: int, seed: int) -> Path:
    """A random adapter in PEFT's format for the engine's model: every projection."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, layer in enumerate(engine.model.model.layers):
        modules = {**{n: getattr(layer.self_attn, n) for n in PROJECTIONS[:4]},
                   **{n: getattr(layer.mlp, n) for n in PROJECTIONS[4:]}}  # fmt: skip
        for name, module in modules.items():
            part = "self_attn" if name in PROJECTIONS[:4] else "mlp"
            prefix = f"base_model.model.model.layers.{i}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=gen) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=gen) * 0.01
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(PROJECTIONS)}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def decode_rate(engine: LLMEngine, adapters: list[str | None], tokens: int, seed: int) -> float:
    """Generated tokens per second over the decode steps of one batch."""
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    requests = [
        engine.add_request([rng.randrange(100, 40000) for _ in range(32)], params, adapter=a)
        for a in adapters
    ]
    while any(
        not r.seqs or r.seqs[0].num_tokens == r.num_prompt_tokens for r in requests if not r.is_finished
    ):
        engine.step()  # prefill, until every request has its first token
    before = sum(r.seqs[0].num_tokens for r in requests if r.seqs)
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - started
    generated = len(adapters) * (tokens + 32) - before
    return generated / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="a .gguf or HF directory (default: SmolLM2)")
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    engine = LLMEngine(
        EngineConfig(model=args.model, device="cpu", kv_cache_gb=0.5, max_loras=2, max_lora_rank=args.rank)
    )
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(("a", "b")):
            engine.add_adapter(load_peft_adapter(name, write_adapter(engine, Path(tmp) / name, args.rank, i)))
    mixed = [(None, "a", "b")[i % 3] for i in range(args.batch)]
    base = [None] * args.batch
    decode_rate(engine, base, 4, seed=99)  # warm-up: kernels built, caches touched
    decode_rate(engine, mixed, 4, seed=98)
    rates: dict[str, list[float]] = {"base": [], "mixed": []}
    for run in range(args.runs):
        rates["base"].append(decode_rate(engine, base, args.tokens, seed=2 * run))
        rates["mixed"].append(decode_rate(engine, mixed, args.tokens, seed=2 * run + 1))
    best = {k: max(v) for k, v in rates.items()}
    print(f"model {engine.model_name}, batch {args.batch}, rank {args.rank}, {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print(
        f"base alone:              {best['base']:8.1f} tokens/s  (runs: {', '.join(f'{r:.1f}' for r in rates['base'])})"
    )
    print(
        f"2 adapters + base mixed: {best['mixed']:8.1f} tokens/s  (runs: {', '.join(f'{r:.1f}' for r in rates['mixed'])})"
    )
    print(f"mixed / base: {best['mixed'] / best['base']:.2f}x")
    print("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
