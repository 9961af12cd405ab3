"""Part 5 of ``python -m tools.gpu_check.gpu_check``: one row per sliding-window family
(Mistral, Gemma 3, gpt-oss) on random weights of a real model's shapes (4 layers, window
32 so that the prompts run past it, SmolLM2's vocabulary): our greedy tokens on the GPU
against transformers' on the same weights (gpt-oss's experts through MXFP4), fp32, TF32
off; then the KV blocks the longest prompt's sequence held at its end against a full
attention pool. On CUDA, Mistral's and Gemma 3's decode steps replay CUDA graphs (the
Triton kernels take the window, soft-cap and sinks), gpt-oss's run eagerly (its experts
read the host). Under ``--cpu-smoke`` the tiny test configs run on the CPU."""

from __future__ import annotations

import gc
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from tools.gpu_check.gpu_check_common import Report, Row

# family -> (the model whose shapes these are, config overrides of tests.support.sliding_models)
SLIDING_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": (
        "Mistral-7B",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
        ),
    ),
    "gemma3": (
        "Gemma-3-4B",
        dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
        ),
    ),
    "gpt_oss": (
        "gpt-oss-20b",
        dict(
            hidden_size=2880,
            intermediate_size=2880,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            num_local_experts=32,
            num_experts_per_tok=4,
        ),
    ),
}


def check_sliding_families(rep: Report, device: torch.device, tiny: bool) -> None:
    root = tempfile.mkdtemp(prefix="gpu-check-sliding-")
    try:
        for family in SLIDING_MODELS:
            if not tiny and rep.left() < 40:
                rep.add(Row("sliding", family, "skipped (time)", status="skip"))
                continue
            rep.guard("sliding", family, lambda f=family: _check(rep, root, f, device, tiny))
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(rep: Report, root: str, family: str, device: torch.device, tiny: bool) -> None:
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.runner.model_loader import load_model
    from inference.sampling.params import SamplingParams
    from tests.support.sliding_models import load_reference, make_sliding_model_dir

    shape_of, overrides = ("tiny test config", {}) if tiny else SLIDING_MODELS[family]
    path = make_sliding_model_dir(Path(root) / family, family, seed=3, **overrides)
    hf = load_reference(path, family, **overrides).to(device)
    rng = random.Random(family)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 37, 230)]
    new_tokens = 8
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids], device=device), max_new_tokens=new_tokens, do_sample=False)
            expected.append(out[0, len(ids) :].tolist())
    del hf
    gc.collect()
    loaded = load_model(path, device=device.type, dtype="float32")
    config = EngineConfig(
        model=str(path), device=device.type, dtype="float32", num_kv_blocks=512, max_num_batched_tokens=1024
    )
    engine = LLMEngine(config, loaded=loaded)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    requests = [engine.add_request(p, params) for p in prompts]
    held = 0
    while engine.has_unfinished():
        engine.step()
        for r in engine.scheduler.running:
            if r is requests[-1]:
                held = engine.block_manager.num_held_blocks(r.seqs[0])
    ours = [engine.request_output(r).token_ids for r in requests]
    same = sum(a == b for a, b in zip(ours, expected, strict=True))
    graphs = engine.runner.cuda_graphs
    graphs_as_expected = (graphs is not None) == (device.type == "cuda" and loaded[0].supports_cuda_graphs)
    replays = graphs.num_replays if graphs is not None else 0
    spec = loaded[0].kv_spec
    full_pages = spec.num_groups * engine.block_manager.blocks_for(len(prompts[-1]) + new_tokens)
    rep.add(
        Row(
            "sliding",
            f"{family} ({shape_of}, 4 layers, window 32): greedy tokens vs transformers, fp32",
            f"{same}/{len(prompts)}; KV pages held {held} vs {full_pages} with full attention; "
            f"{replays} CUDA-graph decode steps",
            "transformers generate",
            "",
            "ok" if same == len(prompts) and graphs_as_expected else "FAIL",
        )
    )
