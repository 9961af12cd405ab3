"""Helpers for the speculative-decoding tests: a tiny random-weight model with a 64-token
vocabulary (so n-grams recur and a chi-square test has few cells), engines on it with and
without speculation, and a proposer that knows the right answer (to control acceptance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.sequence import Sequence
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from tests.support.fakes import make_tiny_model_dir

VOCAB = 64
SMALL_ENGINE = {"num_kv_blocks": 128, "max_num_batched_tokens": 256, "max_num_seqs": 16, "block_size": 4}


@dataclass
class SmallModel:
    path: str
    loaded: tuple[Any, Any, Any]
    hf: torch.nn.Module

    def engine(self, speculative: str | None = None, **overrides: Any) -> LLMEngine:
        kw = {**SMALL_ENGINE, "speculative": speculative, **overrides}
        return LLMEngine(EngineConfig(model=self.path, device="cpu", **kw), loaded=self.loaded)


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> SmallModel:
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(
        tmp_path_factory.mktemp("spec-tiny") / "llama", arch="llama", seed=3, vocab_size=VOCAB
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return SmallModel(str(path), load_model(path, device="cpu"), hf)


class OracleProposer:
    """Proposes each request's reference continuation (from a run without speculation),
    with every ``wrong_every``-th proposed position replaced by a wrong token, so tests
    see long accepted runs and rejections in the middle of proposals."""

    def __init__(self, references: dict[str, list[int]], k: int = 4, wrong_every: int = 7) -> None:
        self.references, self.k, self.wrong_every = references, k, wrong_every
        self.calls = 0

    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        drafts = []
        for seq, limit in zip(seqs, limits, strict=True):
            ref = self.references[seq.request.request_id]  # type: ignore[union-attr]
            done = seq.num_output_tokens
            draft = list(ref[done : done + min(self.k, limit)])
            for j in range(len(draft)):
                self.calls += 1
                if self.calls % self.wrong_every == 0:
                    draft[j] = (draft[j] + 1) % VOCAB
            drafts.append(draft)
        return drafts

    def verified(self, seq: Sequence, draft: list[int], accepted: int) -> None:
        pass


def run_all(
    engine: LLMEngine,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    arrivals: list[int] | None = None,
    check: Any = None,
) -> dict[str, Any]:
    """Add prompt i at step ``arrivals[i]`` (default all at once) as request ``r{i}``; step
    to the end (calling ``check(engine)`` after each step); the outputs by request id."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    arrivals = arrivals or [0] * len(prompts)
    requests = {}
    step = 0
    while len(requests) < len(prompts) or engine.has_unfinished():
        for i, at in enumerate(arrivals):
            if at == step:
                requests[f"r{i}"] = engine.add_request(prompts[i], plist[i], request_id=f"r{i}")
        engine.step()
        if check is not None:
            check(engine)
        step += 1
        assert step < 5000
    return {rid: engine.request_output(r).outputs[0] for rid, r in requests.items()}


def check_tables(engine: LLMEngine) -> None:
    """Every running sequence holds exactly the blocks of its computed tokens."""
    bm = engine.block_manager
    for request in engine.scheduler.running:
        for seq in request.seqs:
            assert len(seq.block_table) == bm.blocks_for(seq.num_computed_tokens)
            assert seq.num_computed_tokens <= seq.num_tokens - 1
