"""The one-call CPU decode step (``kernels.cpu.decode_stack``): bit-identical to the
model's per-op path on fp32 panels and on quantized blocks, taken only by models it
applies to, and refusing a KV cache or slot it would read or write out of bounds.

End to end, the engine's greedy tokens on the default GGUF against HF's
(``test_engine_smollm2.py``) run through it too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.layers import cpu_packing
from inference.layers.cpu_decode_stack import build_decode_stack
from inference.runner.model_loader import load_model
from kernels.cpu import decode_stack as cpu_decode_stack
from kernels.cpu import quant as cpu_quant
from kernels.cpu.quant import QuantRows
from tests.support.fakes import build_context, make_tiny_model_dir

BLOCK = 4


def random_quant_rows(n: int, k: int, fmt: str, gen: torch.Generator) -> QuantRows:
    groups = k // cpu_quant.GROUP[fmt]
    scale = torch.rand(n, groups, generator=gen) * 0.05
    if fmt == "q4":
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int8)
        return QuantRows(fmt, q, scale, -8 * scale)
    return QuantRows(fmt, torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8), scale, None)


def quantize_in_place(model, fmt: str) -> None:
    """Every linear weight of the layers replaced by random ``fmt`` blocks (the loader's
    own installer, as a GGUF load does)."""
    gen = torch.Generator().manual_seed(1)
    rows = {
        name: random_quant_rows(*param.shape, fmt, gen)
        for name, param in model.named_parameters()
        if name.startswith("model.layers.") and name.endswith("proj.weight")
    }
    cpu_packing.install_quantized(model, rows)


def loaded(tmp_path: Path, arch: str, fmt: str | None):
    model, _, config = load_model(make_tiny_model_dir(tmp_path / arch, arch=arch), device="cpu")
    if fmt is not None:
        quantize_in_place(model, fmt)
    model.prepare_cpu_kernels()
    return model, config


def decode_inputs(model, config, cached: list[int], seed: int = 0):
    """A decode step for sequences with ``cached`` tokens already in a NaN-filled pool
    (as stale slots may hold anything), whose cached K/V comes from a real prefill."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    kv = torch.full(
        (num_blocks, 2, config.num_layers, BLOCK, config.num_kv_heads, config.head_dim), float("nan")
    )
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[order.pop() for _ in range(-(-(n + 1) // BLOCK))] for n in cached]
    for table, n in zip(tables, cached, strict=True):
        ids = torch.randint(0, config.vocab_size, (n,), generator=gen)
        model(ids, torch.arange(n), build_context([table], [0], [n], BLOCK), kv)
    ids = torch.randint(0, config.vocab_size, (len(cached),), generator=gen)
    return ids, torch.tensor(cached), build_context(tables, cached, [1] * len(cached), BLOCK), kv


@pytest.mark.parametrize(
    ("arch", "fmt"),
    [("llama", None), ("qwen2", None), ("llama", "q4"), ("qwen2", "q8"), ("llama", "q8s")],
)
def test_one_call_decode_step_is_bit_identical_to_the_per_op_path(tmp_path: Path, arch: str, fmt: str | None):
    model, config = loaded(tmp_path, arch, fmt)
    assert model.decode_stack is not None
    ids, positions, ctx, kv = decode_inputs(model, config, cached=[3, 9, 16, 1])
    kv_per_op = kv.clone()
    stacked = model(ids, positions, ctx, kv)
    stack, model.decode_stack = model.decode_stack, None
    per_op = model(ids, positions, ctx, kv_per_op)
    model.decode_stack = stack
    assert torch.equal(stacked, per_op)
    assert torch.equal(kv.nan_to_num(), kv_per_op.nan_to_num())  # the same K/V stored
    assert torch.isfinite(stacked).all()


def test_a_model_whose_weights_are_not_yet_packed_keeps_the_per_op_path(tmp_path: Path):
    model, _, _ = load_model(make_tiny_model_dir(tmp_path / "llama", arch="llama"), device="cpu")
    assert build_decode_stack(model) is None  # fp32 originals still held: not released
    model.prepare_cpu_kernels()
    assert model.decode_stack is not None


def test_prefill_steps_take_the_per_op_path(tmp_path: Path, monkeypatch):
    model, config = loaded(tmp_path, "llama", "q4")
    calls = []
    monkeypatch.setattr(cpu_decode_stack.DecodeStack, "__call__", lambda *a: calls.append(a))
    kv = torch.zeros(8, 2, config.num_layers, BLOCK, config.num_kv_heads, config.head_dim)
    out = model(torch.tensor([5, 6, 7]), torch.arange(3), build_context([[0]], [0], [3], BLOCK), kv)
    assert out.shape == (3, config.hidden_size) and not calls


@pytest.mark.parametrize("damage", ["slot", "block", "length", "pool"])
def test_an_out_of_range_slot_block_or_length_is_refused(tmp_path: Path, damage: str):
    model, config = loaded(tmp_path, "llama", "q4")
    ids, positions, ctx, kv = decode_inputs(model, config, cached=[3, 5])
    if damage == "slot":
        ctx.slot_mapping[1] = kv.shape[0] * BLOCK  # one past the pool
    elif damage == "block":
        ctx.block_tables[0, 0] = kv.shape[0]
    elif damage == "length":
        ctx.context_lens[1] = ctx.block_tables.shape[1] * BLOCK + 1
    else:
        kv = kv[:, :, :1]  # a pool for one layer, not two
    with pytest.raises(ValueError, match="KV cache|kv_cache"):
        model(ids, positions, ctx, kv)
