"""LoRA adapters served by the engine: the same greedy tokens as transformers + peft on the
same base and adapter, with two adapters (ranks 8 and 16) and the base mixed in one batch;
adapters loaded, replaced and unloaded between steps."""

from __future__ import annotations

import pytest

from inference.lora import LoraLoadError, load_peft_adapter
from tests.engine.engine_fixtures import greedy, random_prompts
from tests.support.hf_generate import hf_greedy
from tests.support.lora import make_peft_adapter, peft_model

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {
        "r8": make_peft_adapter(tiny.path, root / "r8", rank=8, seed=1),
        "r16": make_peft_adapter(
            tiny.path, root / "r16", rank=16, seed=2, targets=["q_proj", "v_proj", "down_proj"]
        ),
    }


def _run(engine, jobs):
    """``jobs``: (prompt ids, adapter or None); all added at once, so they share batches."""
    requests = [
        engine.add_request(ids, greedy(NEW_TOKENS), request_id=f"r{i}", adapter=adapter)
        for i, (ids, adapter) in enumerate(jobs)
    ]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        assert steps < 1000
    return [list(engine.request_output(r).outputs[0].token_ids) for r in requests]


def test_mixed_batch_matches_transformers_and_peft_on_8_of_8_prompts(tiny, adapters):
    prompts = random_prompts(tiny.tokenizer, 8, seed=11, max_len=30)
    engine = tiny.engine(max_loras=2)
    for name, path in adapters.items():
        engine.add_adapter(load_peft_adapter(name, path))
    jobs = [(p, a) for p in prompts for a in (None, "r8", "r16")]
    ours = _run(engine, jobs)
    references = {a: peft_model(tiny.path, adapters[a] if a else None) for a in (None, "r8", "r16")}
    want = [hf_greedy(references[a], p, NEW_TOKENS) for p, a in jobs]
    by_adapter = {
        a: sum(o == w for o, w, (_, ja) in zip(ours, want, jobs, strict=True) if ja == a) for a in references
    }
    assert by_adapter == {None: 8, "r8": 8, "r16": 8}
    # The adapters change the answers: the test would pass vacuously otherwise.
    base = [o for o, (_, a) in zip(ours, jobs, strict=True) if a is None]
    assert base != [o for o, (_, a) in zip(ours, jobs, strict=True) if a == "r8"]
    assert base != [o for o, (_, a) in zip(ours, jobs, strict=True) if a == "r16"]


def test_more_adapters_than_slots_wait_and_evict_the_least_recently_used(tiny, adapters, tmp_path):
    third = make_peft_adapter(tiny.path, tmp_path / "r8b", rank=8, seed=3)
    engine = tiny.engine(max_loras=1)
    for name, path in {**adapters, "r8b": third}.items():
        engine.add_adapter(load_peft_adapter(name, path))
    prompts = random_prompts(tiny.tokenizer, 3, seed=12, max_len=20)
    jobs = [(prompts[0], "r8"), (prompts[1], "r16"), (prompts[2], "r8b")]
    ours = _run(engine, jobs)
    want = [hf_greedy(peft_model(tiny.path, {**adapters, "r8b": third}[a]), p, NEW_TOKENS) for p, a in jobs]
    assert ours == want
    assert list(engine.loras.resident) == ["r8b"]  # one slot: the last one used holds it


def test_a_reloaded_adapter_reuses_no_block_of_the_old_one(tiny, adapters):
    engine = tiny.engine(max_loras=2)
    engine.add_adapter(load_peft_adapter("math", adapters["r8"]))
    prompt = random_prompts(tiny.tokenizer, 1, seed=13, min_len=40, max_len=40)[0]
    first = _run(engine, [(prompt, "math")])
    hits = engine.block_manager.hit_tokens
    engine.add_adapter(load_peft_adapter("math", adapters["r16"]))  # other weights, same name
    second = _run(engine, [(prompt, "math")])
    assert engine.block_manager.hit_tokens == hits  # no cached block of the old weights served
    assert second == [hf_greedy(peft_model(tiny.path, adapters["r16"]), prompt, NEW_TOKENS)]
    assert first != second
    third = _run(engine, [(prompt, "math")])
    assert engine.block_manager.hit_tokens > hits and third == second  # its own blocks are reused


def test_unknown_and_unloaded_adapters_are_refused(tiny, adapters, tmp_path):
    engine = tiny.engine(max_loras=1)
    with pytest.raises(ValueError, match="not loaded"):
        engine.add_request([1, 2, 3], greedy(2), adapter="nope")
    engine.add_adapter(load_peft_adapter("r8", adapters["r8"]))
    assert engine.remove_adapter("r8") and not engine.remove_adapter("r8")
    (tmp_path / "adapter_config.json").write_text('{"r": 8, "use_dora": true}')
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(LoraLoadError, match="DoRA"):
        load_peft_adapter("dora", tmp_path)
