"""The engine's KV paths on a sliding-window model (tiny random Gemma 3: 3 sliding layers,
window 32, per full layer; four KV groups): the disk tier, prefill workers (PD hand-off),
speculative decoding, beam search under preemption, the CUDA-graph decision and the
graphs' static inputs. Each
gives the tokens of the plain engine and leaves every block free."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.kv.block_manager import NO_BLOCK
from inference.runner.cuda_graphs import CUDAGraphRunner
from inference.runner.model_loader import load_model
from inference.runner.model_runner import captures_cuda_graphs
from inference.sampling.params import SamplingParams
from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion
from tests.support.sliding_models import make_sliding_model_dir


class Sliding:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.loaded = load_model(path, device="cpu")

    def engine(self, **overrides: Any) -> LLMEngine:
        kw = {"num_kv_blocks": 256, "max_num_batched_tokens": 256, "max_num_seqs": 8, **overrides}
        return LLMEngine(EngineConfig(model=str(self.path), device="cpu", **kw), loaded=self.loaded)


@pytest.fixture(scope="module")
def sliding(tmp_path_factory: pytest.TempPathFactory) -> Sliding:
    return Sliding(make_sliding_model_dir(tmp_path_factory.mktemp("sliding-kv") / "gemma3", "gemma3", seed=3))


def _tokens(outputs: list[Any]) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def _all_free(engine: LLMEngine) -> bool:
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


def test_a_long_sequence_holds_only_its_windows_blocks(sliding: Sliding) -> None:
    engine = sliding.engine()
    prompt = random_prompts(None, 1, seed=1, min_len=200, max_len=200)[0]
    engine.add_request(prompt, greedy(3))
    engine.step()  # the whole prompt in one chunk
    (seq,) = engine.scheduler.running[0].seqs
    bm = engine.block_manager
    full, *slid = bm.tables(seq)
    assert NO_BLOCK not in full and len(full) == bm.blocks_for(200)
    for table in slid:  # position 200 reads keys from 169 on: blocks 10..12 of 16 tokens
        assert table[:10] == [NO_BLOCK] * 10 and NO_BLOCK not in table[10:]
    while engine.has_unfinished():
        engine.step()
    assert _all_free(engine)


def test_a_history_pushed_out_of_the_pool_comes_back_from_disk(sliding: Sliding, tmp_path: Path) -> None:
    engine = sliding.engine(num_kv_blocks=60, kv_disk_dir=str(tmp_path))
    turn1 = random_prompts(None, 1, seed=5, min_len=120, max_len=120)[0]
    history = turn1 + run_to_completion(engine, [turn1], greedy(8))[0].outputs[0].token_ids
    engine.tiers.disk.flush()
    run_to_completion(engine, random_prompts(None, 4, seed=6, min_len=150, max_len=150), greedy(2))
    turn2 = history + [101, 102, 103]
    request = engine.add_request(turn2, greedy(6))
    while engine.has_unfinished():
        engine.step()
    assert request.num_loaded_tokens > 0  # served from the disk tier, every group's blocks
    expected = run_to_completion(sliding.engine(enable_prefix_caching=False), [turn2], greedy(6))
    assert engine.request_output(request).outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert _all_free(engine)
    engine.close()


@pytest.fixture
def pd_engine(sliding: Sliding) -> Iterator[LLMEngine]:
    engine = sliding.engine(prefill_workers=1, pd_affinity="off", pd_min_prompt_tokens=64)
    assert engine.scheduler.workers.wait_ready(180.0), "the prefill worker did not start"
    yield engine
    engine.close()


def test_prefill_workers_hand_off_every_groups_blocks(sliding: Sliding, pd_engine: LLMEngine) -> None:
    prompts = random_prompts(None, 2, seed=9, min_len=150, max_len=220)
    expected = _tokens(run_to_completion(sliding.engine(), prompts, greedy(6)))
    requests = [pd_engine.add_request(p, greedy(6)) for p in prompts]
    while pd_engine.has_unfinished():
        pd_engine.step()
    assert [[c.token_ids for c in pd_engine.request_output(r).outputs] for r in requests] == expected
    bs = pd_engine.block_manager.block_size
    for request, prompt in zip(requests, prompts, strict=True):
        # Imported as a prefix hit: the full group's blocks and the sliding groups' last window.
        assert request.num_cached_tokens == (len(prompt) - 1) // bs * bs
    assert pd_engine.scheduler.disaggregation_stats()["imported_requests"] == 2


def test_speculative_decoding_gives_the_plain_greedy_tokens(sliding: Sliding) -> None:
    # Repetitive prompts, so n-gram proposals are made and some accepted.
    base = random_prompts(None, 2, seed=12, min_len=12, max_len=12)
    prompts = [b * 6 for b in base] + random_prompts(None, 1, seed=13, min_len=90, max_len=90)
    expected = _tokens(run_to_completion(sliding.engine(), prompts, greedy(24)))
    engine = sliding.engine(speculative="ngram", speculative_max_batch=8, ngram_min=1)
    assert _tokens(run_to_completion(engine, prompts, greedy(24))) == expected
    assert engine.speculator.stats.accepted_tokens > 0  # verification rows ran over group tables
    assert _all_free(engine)


def test_beam_search_survives_preemption_and_a_width_of_one_is_greedy(sliding: Sliding) -> None:
    prompts = random_prompts(None, 3, seed=15, min_len=60, max_len=80)
    beam = SamplingParams(use_beam_search=True, beam_width=2, max_tokens=20, ignore_eos=True, temperature=0)
    roomy = _tokens(run_to_completion(sliding.engine(), prompts, beam))
    tight = sliding.engine(num_kv_blocks=48, max_num_batched_tokens=32)
    assert _tokens(run_to_completion(tight, prompts, beam)) == roomy
    assert tight.scheduler.num_preemptions > 0
    assert _all_free(tight)
    one = SamplingParams(use_beam_search=True, beam_width=1, max_tokens=8, ignore_eos=True, temperature=0)
    greedy_tokens = _tokens(run_to_completion(sliding.engine(), prompts[:1], greedy(8)))
    assert _tokens(run_to_completion(sliding.engine(), prompts[:1], one)) == greedy_tokens


def test_a_sliding_model_is_captured_in_cuda_graphs(sliding: Sliding) -> None:
    """The decision the runner takes on CUDA (no GPU here): the window and soft-cap are
    kernel parameters, so a sliding model's decode steps are captured unless eager."""
    model = sliding.loaded[0]
    cuda = torch.device("cuda")
    assert model.kv_spec.is_hybrid and model.supports_cuda_graphs
    assert captures_cuda_graphs(model, cuda, enforce_eager=False)
    assert not captures_cuda_graphs(model, cuda, enforce_eager=True)
    assert not captures_cuda_graphs(model, torch.device("cpu"), enforce_eager=False)


def test_decoding_through_static_graph_inputs_of_every_kv_group_matches_eager(sliding: Sliding) -> None:
    """What a graph records, run without capture: each KV group's slot mapping and block
    table come from their own static buffers, padded rows included; the tokens are the
    eager engine's."""
    prompts = random_prompts(None, 5, seed=21, min_len=30, max_len=90)
    params = [greedy(20 + 10 * i) for i in range(5)]
    arrivals = [0, 0, 1, 4, 9]
    expected = run_to_completion(sliding.engine(), prompts, params, arrivals)
    engine = sliding.engine()
    runner = engine.runner
    max_blocks = -(-engine.max_model_len // runner.block_size)
    graphs = CUDAGraphRunner(
        runner.model, runner.kv_cache, runner.block_size, 8, max_blocks, runner.kv_spec.num_groups
    )
    graphs.use_static_eager()
    runner.cuda_graphs = graphs
    outputs = run_to_completion(engine, prompts, params, arrivals)
    assert _tokens(outputs) == _tokens(expected)
    assert graphs.num_replays >= 20
    assert _all_free(engine)
