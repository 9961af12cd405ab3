"""The check every GGUF family test ends with: our engine, loading the GGUF file, picks the
same greedy tokens as HF's model on prompts running past a 32-token window."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from tests.engine.engine_fixtures import greedy, run_to_completion
from tests.support.hf_generate import hf_greedy


def assert_gguf_greedy_matches(gguf: Path, loaded: Any, hf: torch.nn.Module, seed: object) -> None:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 40, 90)]  # past the window of 32
    expected = [hf_greedy(hf, p, 6) for p in prompts]
    engine_config = EngineConfig(
        model=str(gguf), device="cpu", num_kv_blocks=64, block_size=16, max_num_batched_tokens=256
    )
    outs = run_to_completion(LLMEngine(engine_config, loaded=loaded), prompts, greedy(6))
    assert [o.outputs[0].token_ids for o in outs] == expected
