"""The KV tiers inside the engine, on the tiny model: exact outputs under memory pressure
with swaps and tier hits, a history coming back from disk, the loading-KV state while
the batch steps on, corrupted block files, a warm restart in a second process, a disk
that cannot be used, and a user's blocks purged from every tier."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inference.engine.llm_engine import LLMEngine
from inference.engine.sequence import RequestStatus, Sequence
from inference.kv.chain_hash import prefix_hashes
from inference.kv.disk_files import namespace_dir
from inference.kv.salt import cache_salt
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion


def assert_nothing_leaked(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert not engine.has_unfinished() and not engine.scheduler.loading
    assert bm.stats().used == 0 and all(b.ref_count == 0 for b in bm.blocks)
    assert bm.num_free_blocks == bm.num_blocks
    disk = engine.tiers.disk
    disk.flush()
    assert not disk._pending and not disk._forced
    assert set(disk.dir.rglob("*.kv")) == {disk._path(h, e.namespace) for h, e in disk._index.items()}
    assert disk.used_bytes == sum(e.size for e in disk._index.values()) <= disk.capacity_bytes


def history_then_churn(tiny: TinyModel, engine: LLMEngine, seed: int) -> tuple[list[int], list[int]]:
    """Turn 1 of a conversation, then other traffic that pushes it out of the pool.
    Returns (turn 1 prompt + answer, turn 2 prompt)."""
    turn1 = random_prompts(tiny.tokenizer, 1, seed=seed, min_len=50, max_len=50)[0]
    answer = run_to_completion(engine, [turn1], greedy(14))[0].token_ids
    history = turn1 + answer
    engine.tiers.disk.flush()
    churn = random_prompts(tiny.tokenizer, 6, seed=seed + 1, min_len=60, max_len=60)
    run_to_completion(engine, churn, greedy(2))
    assert engine.block_manager.match_prefix(Sequence(history + [7], len(history) + 1)) == []  # pushed out
    return history, history + [101, 102, 103, 104, 105]


def prefill_tokens(engine: LLMEngine, request_id: str) -> list[int]:
    """Record the tokens each step computes for ``request_id``."""
    counted: list[int] = []
    execute = engine.runner.execute

    def spy(batch):
        counted.extend(
            n
            for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if s.request.request_id == request_id
        )
        return execute(batch)

    engine.runner.execute = spy
    return counted


def test_a_pool_too_small_swaps_and_hits_the_disk_with_outputs_unchanged(
    tiny: TinyModel, tmp_path: Path
) -> None:
    prompts = random_prompts(tiny.tokenizer, 6, seed=7, min_len=30, max_len=45)
    prompts[3] = prompts[0][:32] + prompts[3]  # a shared history
    roomy = run_to_completion(tiny.engine(), prompts, greedy(30))
    engine = tiny.engine(num_kv_blocks=12, kv_disk_dir=str(tmp_path))
    tight = run_to_completion(engine, prompts, greedy(30))
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.num_swaps > 0
    assert engine.tiers.counters.loaded_blocks > 0  # swapped blocks came back from disk
    assert stats.kv_tiers["disk"]["bytes_read"] > 0 and stats.kv_tiers["disk"]["bytes_written"] > 0
    again = run_to_completion(engine, prompts[:2], greedy(3))  # their prefixes now live on disk
    assert all(o.num_cached_tokens > 0 for o in again)
    assert engine.stats().kv_tiers["disk"]["hit_tokens"] > 0
    assert_nothing_leaked(engine)
    engine.close()


def test_a_history_pushed_out_of_the_pool_comes_back_from_disk(tiny: TinyModel, tmp_path: Path) -> None:
    engine = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))
    bs = engine.block_manager.block_size
    history, turn2 = history_then_churn(tiny, engine, seed=30)
    counted = prefill_tokens(engine, "turn2")
    request = engine.add_request(turn2, greedy(8), request_id="turn2")
    while engine.has_unfinished():
        engine.step()
    expected = (len(history) - 1) // bs * bs
    assert request.num_cached_tokens == expected == request.num_loaded_tokens
    assert engine.stats().kv_tiers["disk"]["hit_tokens"] == expected
    # The prefill computed only what no tier had; then 7 decode steps (the 8th token is never fed).
    assert sum(counted) == len(turn2) - expected + 7
    uncached = run_to_completion(tiny.engine(enable_prefix_caching=False), [turn2], greedy(8))[0]
    assert engine.request_output(request).token_ids == uncached.token_ids
    assert_nothing_leaked(engine)
    engine.close()


def test_a_request_loading_kv_waits_in_its_own_state_while_the_batch_steps(
    tiny: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))
    _, turn2 = history_then_churn(tiny, engine, seed=40)
    disk, release = engine.tiers.disk, threading.Event()
    slow_read = disk.read
    monkeypatch.setattr(disk, "read", lambda *a: release.wait(30) and slow_read(*a))
    other = engine.add_request(
        random_prompts(tiny.tokenizer, 1, seed=41, min_len=8, max_len=8)[0], greedy(20)
    )
    engine.step()
    loading = engine.add_request(turn2, greedy(4))
    for _ in range(4):
        engine.step()
    assert loading.status is RequestStatus.LOADING_KV and engine.stats().loading == 1
    assert engine.request_output(other).outputs[0].token_ids and len(other.seqs[0].output_token_ids) >= 4
    release.set()
    while engine.has_unfinished():
        engine.step()
    assert loading.num_loaded_tokens > 0 and engine.request_output(loading).finish_reason == "length"
    engine.close()


def test_a_corrupted_block_file_is_recomputed_not_served(tiny: TinyModel, tmp_path: Path) -> None:
    engine = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))
    bs = engine.block_manager.block_size
    history, turn2 = history_then_churn(tiny, engine, seed=50)
    path = tmp_path / f"{prefix_hashes(history, bs, root=engine.block_manager.hash_root)[1]:016x}.kv"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x10
    path.write_bytes(bytes(raw))
    out = run_to_completion(engine, [turn2], greedy(8))[0]
    assert out.num_cached_tokens == bs  # block 1 served, block 2 and everything after recomputed
    assert engine.stats().kv_tiers["disk"]["corrupt_blocks"] == 1
    uncached = run_to_completion(tiny.engine(enable_prefix_caching=False), [turn2], greedy(8))[0]
    assert out.token_ids == uncached.token_ids
    engine.close()


WARM_RESTART = """
import json, sys
from inference.engine.llm_engine import LLMEngine
from inference.config import EngineConfig
from inference.sampling.params import SamplingParams
model, kv_dir, block_size, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
engine = LLMEngine(EngineConfig(model=model, device="cpu", num_kv_blocks=64, kv_disk_dir=kv_dir, block_size=block_size))
request = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
while engine.has_unfinished():
    engine.step()
out = engine.request_output(request)
print(json.dumps({"cached": out.num_cached_tokens, "disk": engine.tiers.counters.hit_tokens["disk"],
                  "blocks": len(engine.tiers.disk), "tokens": out.token_ids}))
engine.close()
"""


def test_warm_restart_in_a_second_process_hits_the_tier_and_another_block_size_empties_it(
    tiny: TinyModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = tiny.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path))
    bs = engine.block_manager.block_size
    history = random_prompts(tiny.tokenizer, 1, seed=60, min_len=70, max_len=70)[0]
    first = run_to_completion(engine, [history], greedy(10))[0]
    engine.close()  # the first process ends; its blocks stay on disk
    turn2 = history + first.token_ids + [201, 202, 203]

    def second_process(block_size: int) -> dict:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                WARM_RESTART,
                tiny.path,
                str(tmp_path),
                str(block_size),
                json.dumps(turn2),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    warm = second_process(bs)
    known = (len(history) + len(first.token_ids) - 1) // bs * bs
    assert warm["cached"] == warm["disk"] == known
    uncached = run_to_completion(tiny.engine(enable_prefix_caching=False), [turn2], greedy(4))[0]
    assert warm["tokens"] == uncached.token_ids
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        other = tiny.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path), block_size=bs // 2)
    assert len(other.tiers.disk) == 0 and not list(tmp_path.glob("*.kv"))
    assert len([r for r in caplog.records if "fingerprint changed" in r.message]) == 1
    assert run_to_completion(other, [turn2], greedy(4))[0].num_cached_tokens == 0
    other.close()


def test_a_disk_tier_of_size_zero_or_unwritable_leaves_one_tier_with_one_warning(
    tiny: TinyModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        zero = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path / "kv"), kv_disk_gb=0)
        unwritable = tiny.engine(num_kv_blocks=14, kv_disk_dir=str(blocker / "kv"))
    assert zero.tiers is None and unwritable.tiers is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    prompts = random_prompts(tiny.tokenizer, 4, seed=7, min_len=30, max_len=45)
    roomy = run_to_completion(tiny.engine(), prompts, greedy(20))
    assert [o.token_ids for o in run_to_completion(zero, prompts, greedy(20))] == [o.token_ids for o in roomy]


def test_a_purged_users_blocks_leave_the_pool_and_the_disk_and_a_restart_cannot_serve_them(
    tiny: TinyModel, tmp_path: Path
) -> None:
    prompts = random_prompts(tiny.tokenizer, 2, seed=11, min_len=60, max_len=60)
    engine = tiny.engine(kv_disk_dir=str(tmp_path))
    for user, prompt in zip(("user:1", "user:2"), prompts, strict=True):
        engine.add_request(prompt, greedy(4), cache_namespace=user)
        while engine.has_unfinished():
            engine.step()
    disk = engine.tiers.disk
    disk.flush()
    roots = {name: cache_salt(name, None).namespace for name in ("user:1", "user:2")}
    folders = {name: namespace_dir(disk.dir, root) for name, root in roots.items()}
    assert all(list(folder.glob("*.kv")) for folder in folders.values())

    engine.purge_namespace("user:1")
    disk.flush()
    assert not folders["user:1"].exists() and list(folders["user:2"].glob("*.kv"))
    assert all(e.namespace != roots["user:1"] for e in disk._index.values())
    assert_nothing_leaked(engine)
    engine.close()

    restarted = tiny.engine(kv_disk_dir=str(tmp_path))  # a warm restart on the same directory
    outputs = []
    for user, prompt in zip(("user:1", "user:2"), prompts, strict=True):
        request = restarted.add_request(prompt, greedy(1), cache_namespace=user)
        while restarted.has_unfinished():
            restarted.step()
        outputs.append(request)
    assert outputs[0].num_cached_tokens == 0
    bs = restarted.block_manager.block_size
    assert outputs[1].num_cached_tokens == (len(prompts[1]) - 1) // bs * bs  # from disk
    restarted.close()
