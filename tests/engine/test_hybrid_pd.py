"""Prefill workers (PD hand-off) on a hybrid model (tiny random Qwen3.5 saved as a model
directory, a real worker process): each long prompt is prefilled at the worker, its KV
blocks and its recurrent state (every recurrent layer's conv and recurrent tensors after
those blocks) come back, the request is admitted as a prefix hit of every shipped block,
and the greedy tokens are HF's on the same weights."""

from __future__ import annotations

import random
from pathlib import Path

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.pd.scheduler import DisaggregatedScheduler
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from tests.support.hf_generate import hf_greedy
from tests.support.hybrid_models import make_hybrid_pair, save_hybrid_model_dir

VOCAB = 320
READY_S = 180.0
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def test_prefill_workers_hand_over_blocks_and_recurrent_state(tmp_path: Path) -> None:
    hf, _ = make_hybrid_pair("qwen3_5")
    path = save_hybrid_model_dir(hf, tmp_path / "qwen3_5")
    config = EngineConfig(
        model=str(path),
        device="cpu",
        num_kv_blocks=128,
        max_num_batched_tokens=64,
        prefill_workers=1,
        pd_affinity="off",
        pd_min_prompt_tokens=32,
    )
    engine = LLMEngine(config, loaded=load_model(path, device="cpu"))
    try:
        scheduler = engine.scheduler
        assert isinstance(scheduler, DisaggregatedScheduler)
        assert scheduler.workers.wait_ready(READY_S), "the prefill worker did not start"
        prompts = [_prompt(70, seed=1), _prompt(101, seed=2)]
        requests = [engine.add_request(p, GREEDY) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        outputs = [engine.request_output(r).outputs[0].token_ids for r in requests]
        stats = scheduler.disaggregation_stats()
    finally:
        engine.close()
    assert outputs == [hf_greedy(hf, p, 6) for p in prompts]
    assert stats["imported_requests"] == 2 and stats["fallbacks_total"] == 0
    for request, prompt in zip(requests, prompts, strict=True):
        # Served from the shipped blocks and state: only the last partial block ran here.
        assert request.num_cached_tokens == (len(prompt) - 1) // 16 * 16
