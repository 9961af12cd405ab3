"""KV memory of one long conversation on a sliding-window model, against the same model
with full attention, in one process: ``python -m benchmarks.bench_sliding_kv``.

"held" is the pool the conversation holds once it is long (its last step); "peak" the
most it held at any point, a prompt chunk's blocks included (the sliding groups hold a
whole chunk while it is computed, then return what fell out of the window).

Both are tiny random Gemma 3 checkpoints (transformers' config class) of 8 layers, one
with 3 sliding layers (window 32) per full layer, one with every layer full. One
conversation of ``--tokens`` tokens (the prompt, then ``--new`` generated ones) runs
through the engine; after every step the pool's held blocks are read. Block sizes
differ (a sliding model's page holds the layers of one KV group, a full model's every
layer), so the figure compares KV bytes held; blocks are printed with their size.
Prompt chunks are the engine's default 512 tokens.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from tests.support.sliding_models import WINDOW, make_sliding_model_dir


def held_kv(path: Path, tokens: int, new: int, block_size: int) -> dict[str, Any]:
    loaded = load_model(path, device="cpu")
    spec = loaded[0].kv_spec
    config = EngineConfig(
        model=str(path),
        device="cpu",
        num_kv_blocks=(tokens // block_size + 8) * spec.num_groups,
        block_size=block_size,
        max_num_batched_tokens=512,
        max_num_seqs=1,
        max_model_len=tokens + 16,
    )
    engine = LLMEngine(config, loaded=loaded)
    bm = engine.block_manager
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(tokens - new)]
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
    peak = last = 0
    drop = bm.drop_out_of_window

    def drop_and_count(seq: Any) -> int:
        # Held just after a step, before the blocks it moved past are returned: the peak
        # (a prompt chunk's blocks are all held while it is computed).
        nonlocal peak
        peak = max(peak, bm.num_held_blocks(seq))
        return drop(seq)

    bm.drop_out_of_window = drop_and_count  # type: ignore[method-assign]
    while engine.has_unfinished():
        engine.step()
        seqs = [s for r in engine.scheduler.running for s in r.seqs]
        if seqs:
            last = sum(bm.num_held_blocks(s) for s in seqs)
    block_bytes = spec.block_bytes(block_size, loaded[0].model.embed_tokens.weight.dtype)
    return {
        "groups": spec.num_groups,
        "layers_per_block": spec.layers_per_block,
        "block_bytes": block_bytes,
        "held_blocks": last,
        "peak_blocks": peak,
        "held_bytes": last * block_bytes,
        "peak_bytes": peak * block_bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="conversation length (prompt + new)")
    parser.add_argument("--new", type=int, default=16, help="generated tokens at its end")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    pattern = ["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(args.layers)]
    overrides = {"num_layers": args.layers, "max_position_embeddings": args.tokens + 64}
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, layer_types in (("sliding", pattern), ("full", ["full_attention"] * args.layers)):
            path = make_sliding_model_dir(Path(tmp) / name, "gemma3", layer_types=layer_types, **overrides)
            results[name] = held_kv(path, args.tokens, args.new, args.block_size)
    s, f = results["sliding"], results["full"]
    print(
        f"one {args.tokens}-token conversation, {args.layers} layers, window {WINDOW}, block {args.block_size}"
    )
    for name, r in results.items():
        print(
            f"  {name:8s} {r['groups']} KV group(s) of {r['layers_per_block']} layer(s): "
            f"held {r['held_blocks']} blocks of {r['block_bytes']} B = {r['held_bytes'] / 2**20:.2f} MiB "
            f"(peak {r['peak_blocks']} blocks = {r['peak_bytes'] / 2**20:.2f} MiB)"
        )
    print(f"KV held, sliding / full attention: {s['held_bytes'] / f['held_bytes']:.3f}x (target <= 0.35x)")
    print(f"peak KV, sliding / full attention: {s['peak_bytes'] / f['peak_bytes']:.3f}x")


if __name__ == "__main__":
    main()
