"""Saved recurrent states in the disk tier (``inference.kv.state_tiers``,
``inference.kv.hybrid_tiers``), through the engine on the tiny Qwen3.5 / Qwen3-Next of
``tests.test_hybrid_engine``:

- a warm restart on the same disk directory resumes a conversation's next turn from the
  state saved at the end of the previous answer (reported as cached tokens, its KV
  blocks read from disk) and still gives HF's greedy tokens;
- a restart whose KV block read fails part-way falls back to the start (the state it
  read belongs to the whole prefix) and still gives HF's tokens;
- a restart with other weights finds nothing (another fingerprint);
- purging a namespace deletes its saved states from the pool and the disk.
"""

from __future__ import annotations

from pathlib import Path

import torch

from inference.kv.chain_hash import prefix_hashes
from inference.runner.weights_identity import tag
from inference.sampling.params import SamplingParams
from tests.support.hybrid_models import make_hybrid_pair
from tests.test_hybrid_engine import _hf_greedy, _llm, _prompt
from tests.test_hybrid_engine import family as family  # noqa: F401 - the module's fixture

ANSWER = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _first_turn(name: str, model: torch.nn.Module, disk: Path) -> list[int]:
    """Run a 150-token turn with a 16-token answer on a fresh engine, then close it; the
    conversation so far (166 tokens: the answer's last boundary is at 160). The model is
    tagged with what it was built from, as ``load_model`` tags a loaded one."""
    tag(model, {"test": name, "seed": 0})
    llm = _llm(name, model, kv_disk_dir=str(disk))
    turn = _prompt(150, seed=5)
    answer = llm.generate(turn, ANSWER)[0].outputs[0].token_ids
    llm.engine.close()
    return turn + answer


def test_a_warm_restart_resumes_the_next_turn_from_the_disk_tier(family, tmp_path: Path) -> None:
    name, hf, ours = family
    history = _first_turn(name, ours, tmp_path)
    next_turn = history + _prompt(20, seed=6)
    restarted = _llm(name, ours, kv_disk_dir=str(tmp_path))
    out = restarted.generate(next_turn, ANSWER)[0]
    stats = restarted.engine.scheduler.block_manager.state_tiers.stats()
    restarted.engine.close()
    assert out.num_cached_tokens == 160  # the state at the answer's last block boundary
    assert stats["restored_states"] == 1
    assert out.outputs[0].token_ids == _hf_greedy(hf, next_turn, 16)


def test_a_failed_block_read_after_a_restart_falls_back_and_recomputes(family, tmp_path: Path) -> None:
    name, hf, ours = family
    history = _first_turn(name, ours, tmp_path)
    sixth_block = prefix_hashes(history, 16, 0, 0, 0)[5]  # the engine's chains start at root 0
    block_file = tmp_path / f"{sixth_block:016x}.kv"
    block_file.write_bytes(block_file.read_bytes()[:-64])  # truncated: its read fails the checks
    next_turn = history + _prompt(20, seed=6)
    restarted = _llm(name, ours, kv_disk_dir=str(tmp_path))
    out = restarted.generate(next_turn, ANSWER)[0]
    tiers = restarted.engine.tiers
    restarted.engine.close()
    assert tiers is not None and tiers.counters.failed_loads == 1
    assert out.num_cached_tokens == 0  # five blocks were served, but no state ends there
    assert out.outputs[0].token_ids == _hf_greedy(hf, next_turn, 16)


def test_a_restart_with_other_weights_serves_no_saved_state(family, tmp_path: Path) -> None:
    name, hf, ours = family
    history = _first_turn(name, ours, tmp_path)
    other_hf, other = make_hybrid_pair(name, seed=1)
    tag(other, {"test": name, "seed": 1})
    next_turn = history + _prompt(20, seed=6)
    restarted = _llm(name, other, kv_disk_dir=str(tmp_path))
    out = restarted.generate(next_turn, ANSWER)[0]
    restarted.engine.close()
    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == _hf_greedy(other_hf, next_turn, 16)


def _finish(engine, prompt: list[int], **options: object) -> None:
    engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), **options)
    while engine.has_unfinished():
        engine.step()


def test_purging_a_namespace_drops_its_saved_states_from_pool_and_disk(family, tmp_path: Path) -> None:
    name, _, ours = family
    engine = _llm(name, ours, kv_disk_dir=str(tmp_path)).engine
    bm = engine.scheduler.block_manager
    _finish(engine, _prompt(100, seed=7), cache_namespace="user:1")
    _finish(engine, _prompt(100, seed=8))
    bm.state_tiers.flush()
    namespaces = {entry.namespace for entry in bm.saved}
    assert len(namespaces) == 2 and 0 in namespaces
    salted = max(namespaces)
    disk = bm.state_tiers.disk
    on_disk = len(disk)
    assert (tmp_path / "states" / f"{salted:016x}").is_dir()
    engine.purge_namespace("user:1")
    assert {entry.namespace for entry in bm.saved} == {0}
    assert not (tmp_path / "states" / f"{salted:016x}").exists()
    assert 0 < len(disk) < on_disk
    engine.close()
