"""Fixtures and helpers for the engine tests: one tiny random-weight model loaded once
per session, engines of any configuration built on it, and HF's reference greedy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import StreamDelta
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from tests.support.fakes import make_tiny_model_dir

TINY_ENGINE_DEFAULTS: dict[str, Any] = {
    "num_kv_blocks": 256,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 32,
}


@dataclass
class TinyModel:
    path: str
    loaded: tuple[Any, Any, Any]  # load_model's (model, tokenizer, model_config)
    hf: torch.nn.Module

    @property
    def tokenizer(self) -> Any:
        return self.loaded[1]

    def engine(self, **overrides: Any) -> LLMEngine:
        config = EngineConfig(model=self.path, device="cpu", **{**TINY_ENGINE_DEFAULTS, **overrides})
        return LLMEngine(config, loaded=self.loaded)

    def hf_greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
            )
        return out[0, len(ids) :].tolist()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp("engine-tiny") / "llama", arch="llama", seed=5)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # fixed-length greedy runs
    hf.generation_config.pad_token_id = 0
    return TinyModel(str(path), load_model(path, device="cpu"), hf)


def random_prompts(
    tokenizer: Any, count: int, seed: int, min_len: int = 5, max_len: int = 60
) -> list[list[int]]:
    """Token-id prompts of varied lengths (text would tokenise to few distinct lengths)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def greedy(max_tokens: int = 16, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run_to_completion(
    engine: LLMEngine,
    prompts: list[list[int] | str],
    params: SamplingParams | list[SamplingParams],
    arrival_steps: list[int] | None = None,
    on_step: Callable[[LLMEngine, list[StreamDelta]], None] | None = None,
) -> list[Any]:
    """Add each prompt at its arrival step (default: all at once), step until all are
    done, and return ``RequestOutput``s in prompt order."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    arrival_steps = arrival_steps or [0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: arrival_steps[i])
    requests: dict[int, Any] = {}
    step = 0
    while len(requests) < len(prompts) or engine.has_unfinished():
        while order and arrival_steps[order[0]] <= step:
            i = order.pop(0)
            requests[i] = engine.add_request(prompts[i], plist[i], request_id=f"r{i}")
        deltas = engine.step()
        if on_step:
            on_step(engine, deltas)
        step += 1
        assert step < 10_000, "engine does not finish"
    return [engine.request_output(requests[i]) for i in range(len(prompts))]
