"""Part 4 of ``python -m tools.gpu_check.gpu_check``: one row per model family served by the
shared Llama decoder, on random weights of the family's real shapes (a few layers, SmolLM2's
vocabulary so the test tokenizer fits): our greedy tokens on the GPU, eager and with CUDA
graphs, against transformers' on the same weights, all in fp32 (TF32 off). Under
``--cpu-smoke`` the tiny test configs run on the CPU instead, to check the script."""

from __future__ import annotations

import gc
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from tools.gpu_check.gpu_check_common import Report, Row

_LONGROPE_96 = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.75,
    "short_factor": [1.0 + 0.02 * i for i in range(48)],
    "long_factor": [1.0 + 0.5 * i for i in range(48)],
    "original_max_position_embeddings": 4096,
}

# family -> (the model whose shapes these are, config overrides of tests.support.families)
FAMILY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": (
        "Qwen3-8B",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
        ),
    ),
    "qwen3_moe": (
        "Qwen3-30B-A3B",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            mlp_only_layers=[],
        ),
    ),
    "phi3": (
        "Phi-4-mini",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_attention_heads=24,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rope_parameters=_LONGROPE_96,
        ),
    ),
    "olmo2": (
        "OLMo-2-7B",
        dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32),
    ),
    "granite": (
        "Granite-3.1-8B",
        dict(
            hidden_size=4096,
            intermediate_size=12800,
            num_attention_heads=32,
            num_key_value_heads=8,
            embedding_multiplier=12.0,
            attention_multiplier=0.0078125,
            residual_multiplier=0.22,
            logits_scaling=16.0,
        ),
    ),
    "smollm3": (
        "SmolLM3-3B",
        dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=4),
    ),
}
_LAYERS = 4  # SmolLM3's NoPE layer is the fourth


def check_families(rep: Report, device: torch.device, tiny: bool) -> None:
    try:
        from tests.support.families import FAMILIES, make_family_model_dir
    except Exception as exc:  # the rows above still stand
        rep.add(
            Row(
                "families",
                "import tests.support.families",
                f"{type(exc).__name__}: {exc}"[:100],
                status="ERROR",
            )
        )
        return
    root = tempfile.mkdtemp(prefix="gpu-check-families-")
    try:
        for family in FAMILIES:
            if not tiny and rep.left() < 40:
                rep.add(Row("families", family, "skipped (time)", status="skip"))
                continue
            rep.guard(
                "families",
                family,
                lambda f=family: _check_family(rep, make_family_model_dir, root, f, device, tiny),
            )
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_family(
    rep: Report, make_dir: Any, root: str, family: str, device: torch.device, tiny: bool
) -> None:
    from transformers import AutoModelForCausalLM

    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.runner.model_loader import load_model
    from inference.sampling.params import SamplingParams

    shape_of, overrides = ("tiny test config", {}) if tiny else FAMILY_MODELS[family]
    path = str(make_dir(Path(root) / family, family, seed=3, num_hidden_layers=_LAYERS, **overrides))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    hf.generation_config.eos_token_id = None  # fixed-length greedy runs
    hf.generation_config.pad_token_id = 0
    rng = random.Random(family)
    # No prompt crosses LongRoPE's original context while decoding (the tiny Phi-3's is 64):
    # transformers then recomputes the whole cache with the long factors, which we do not
    # (inference.layers.rotary.longrope_rows).
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 37, 230)]
    new_tokens = 8
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(
                torch.tensor([ids], device=device),
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=None,
            )
            expected.append(out[0, len(ids) :].tolist())
    del hf
    gc.collect()
    loaded = load_model(path, device=device.type, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    modes = [True] if device.type == "cpu" else [True, False]
    results = []
    for eager in modes:
        config = EngineConfig(
            model=path,
            device=device.type,
            dtype="float32",
            enforce_eager=eager,
            num_kv_blocks=256,
            max_num_batched_tokens=1024,
            max_num_seqs=8,
        )
        engine = LLMEngine(config, loaded=loaded)
        requests = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
        while engine.has_unfinished():
            engine.step()
        ours = [engine.request_output(r).token_ids for r in requests]
        same = sum(a == b for a, b in zip(ours, expected, strict=True))
        graphs = engine.runner.cuda_graphs
        label = "eager" if eager else ("CUDA graphs" if graphs is not None else "graphs n/a (eager)")
        results.append((label, same))
        del engine
    ok = all(same == len(prompts) for _, same in results)
    rep.add(
        Row(
            "families",
            f"{family} ({shape_of}, {_LAYERS} layers): greedy tokens vs transformers, fp32",
            ", ".join(f"{label} {same}/{len(prompts)}" for label, same in results),
            "transformers generate",
            "",
            "ok" if ok else "FAIL",
        )
    )
