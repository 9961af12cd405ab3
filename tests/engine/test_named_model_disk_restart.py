"""A named model (ENGINE_MODELS: ``EngineConfig.served_name``) chains its block hashes from
its own non-zero root, and a restart of it on the same disk directory finds its blocks
there; another name on that directory finds none of them."""

from __future__ import annotations

from pathlib import Path

from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion


def test_a_named_model_restarted_finds_its_disk_blocks_and_another_name_does_not(tiny, tmp_path: Path):
    prompt = random_prompts(tiny.tokenizer, 1, seed=80, min_len=70, max_len=70)[0]
    first = tiny.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path), served_name="writer")
    root = first.block_manager.hash_root
    expected = run_to_completion(first, [prompt], greedy(6))[0].token_ids
    first.close()
    assert root != 0

    restarted = tiny.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path), served_name="writer")
    assert restarted.block_manager.hash_root == root  # the same root in every process
    out = run_to_completion(restarted, [prompt], greedy(6))[0]
    disk_hits = restarted.stats().kv_tiers["disk"]["hit_tokens"]
    bs = restarted.block_manager.block_size
    restarted.close()
    assert out.token_ids == expected
    assert disk_hits == out.num_cached_tokens == (len(prompt) - 1) // bs * bs

    other = tiny.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path), served_name="reader")
    out = run_to_completion(other, [prompt], greedy(6))[0]
    other.close()
    assert out.num_cached_tokens == 0 and out.token_ids == expected
