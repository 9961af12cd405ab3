"""LoRA adapters inside the one-call CPU decode step: a decode batch mixing two adapters
and the base model gives what the per-op path with the adapters gives (on fp32 panels and
on quantized blocks), the engine's mixed decode steps take that one call, and a wrong
adapter stack or row slot is refused before the C call.

End to end, ``test_lora.py``'s mixed batches match transformers + peft through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chatsite_kernels.cpu import decode_stack as cpu_decode_stack
from chatsite_kernels.cpu.stack_adapters import AdapterGroup
from inference.lora import LoraManager, load_peft_adapter
from tests.engine.engine_fixtures import greedy, random_prompts
from tests.engine.test_decode_stack import decode_inputs, loaded
from tests.support.lora import make_peft_adapter

ROWS = [None, "a", "b", "a", None]


def spy_on_the_one_call(monkeypatch) -> list:
    """Each one-call decode step's adapters (None: none), as the steps run."""
    calls = []
    original = cpu_decode_stack.DecodeStack.__call__

    def spy(self, *args, **kwargs):
        calls.append(args[6] if len(args) > 6 else kwargs.get("adapters"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cpu_decode_stack.DecodeStack, "__call__", spy)
    return calls


def with_adapters(tmp_path: Path, arch: str, fmt: str | None):
    model, config = loaded(tmp_path, arch, fmt)
    manager = LoraManager(model, max_loras=2, max_rank=16)
    base = tmp_path / arch
    manager.add(load_peft_adapter("a", make_peft_adapter(base, tmp_path / "a", rank=8, seed=1, scale_b=20)))
    manager.add(
        load_peft_adapter(
            "b",
            make_peft_adapter(
                base, tmp_path / "b", rank=16, seed=2, targets=["k_proj", "up_proj"], scale_b=20
            ),
        )
    )
    return model, config, manager


@pytest.mark.parametrize(("arch", "fmt"), [("llama", None), ("qwen2", None), ("llama", "q4")])
def test_a_mixed_decode_step_in_one_call_matches_the_per_op_path(
    tmp_path: Path, monkeypatch, arch: str, fmt: str | None
):
    model, config, manager = with_adapters(tmp_path, arch, fmt)
    assert model.decode_stack is not None
    ids, positions, ctx, kv = decode_inputs(model, config, cached=[3, 9, 16, 1, 7])
    kv_per_op = kv.clone()
    slots = manager.row_slots(ROWS, [1] * len(ROWS))
    calls = spy_on_the_one_call(monkeypatch)
    with manager.step(slots):
        stacked = model(ids, positions, ctx, kv).clone()
    assert len(calls) == 1 and calls[0] is not None  # the one call ran, with the adapters
    stack, model.decode_stack = model.decode_stack, None
    with manager.step(slots):
        per_op = model(ids, positions, ctx, kv_per_op)
    base_only = model(ids, positions, ctx, kv_per_op.clone())
    model.decode_stack = stack
    # The SiLU of the MLP with adapters is the kernel's, not torch's: equal to rounding.
    torch.testing.assert_close(stacked, per_op, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(kv.nan_to_num(), kv_per_op.nan_to_num(), rtol=1e-4, atol=1e-5)
    # Base rows are the base model's exactly; adapter rows differ from it (not vacuous).
    base_rows = [i for i, name in enumerate(ROWS) if name is None]
    adapter_rows = [i for i, name in enumerate(ROWS) if name is not None]
    assert torch.equal(stacked[base_rows], base_only[base_rows])
    for i in adapter_rows:
        assert (stacked[i] - base_only[i]).abs().max() > 1e-3


def test_the_engine_runs_mixed_decode_steps_in_the_one_call(tiny, tmp_path, monkeypatch):
    engine = tiny.engine(max_loras=2)
    engine.add_adapter(load_peft_adapter("a", make_peft_adapter(tiny.path, tmp_path / "a", rank=8, seed=3)))
    assert engine.model.decode_stack is not None
    with_adapters_calls = spy_on_the_one_call(monkeypatch)
    prompts = random_prompts(tiny.tokenizer, 2, seed=21, max_len=12)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, greedy(4), request_id=f"r{i}", adapter="a" if i else None)
    while engine.has_unfinished():
        engine.step()
    assert with_adapters_calls and all(step is not None for step in with_adapters_calls)


@pytest.mark.parametrize("case", ["slot", "a_shape", "b_shape", "layers"])
def test_a_wrong_adapter_stack_or_row_slot_is_refused(tmp_path: Path, case: str):
    model, _, manager = with_adapters(tmp_path, "llama", None)
    stack = model.decode_stack
    layers = [{g: AdapterGroup(s.a, tuple(s.b)) for g, s in groups.items()} for groups in manager.stacks]
    if case == "slot":
        adapters = stack.adapters(layers, 2, 16)
        with pytest.raises(IndexError, match="row_slots"):
            adapters.step(torch.tensor([0, 2], dtype=torch.int32), manager.scales, 2)
        return
    if case == "a_shape":
        layers[1]["o"] = AdapterGroup(layers[1]["o"].a[:, :8].contiguous(), layers[1]["o"].b)
        match = "layer 1 o A"
    elif case == "b_shape":
        b = layers[0]["qkv"].b
        layers[0]["qkv"] = AdapterGroup(layers[0]["qkv"].a, (b[0], b[2][:, :-1].contiguous(), b[2]))
        match = "layer 0 qkv B1"
    else:
        layers = layers[:-1]
        match = "layers of stacks"
    with pytest.raises(ValueError, match=match):
        stack.adapters(layers, 2, 16)
