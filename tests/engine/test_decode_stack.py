"""The one-call CPU decode step (``chatsite_kernels.cpu.decode_stack``): bit-identical to the
model's per-op path on fp32 panels and on quantized blocks, with an fp32 or a float16
KV pool, taken only by models it applies to, and refusing a KV cache or slot it would read or write out of bounds.

End to end, the engine's greedy tokens on the default GGUF against HF's
(``test_engine_smollm2.py``) run through it too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import decode_stack as cpu_decode_stack
from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import QuantRows
from inference.layers import cpu_packing
from inference.layers.cpu_decode_stack import build_decode_stack
from inference.runner.model_loader import load_model
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


def decode_inputs(model, config, cached: list[int], seed: int = 0, cache_dtype: torch.dtype = torch.float32):
    """A decode step for sequences with ``cached`` tokens already in a NaN-filled pool
    (as stale slots may hold anything), whose cached K/V comes from a real prefill."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    kv = torch.full(
        (num_blocks, 2, config.num_layers, BLOCK, config.num_kv_heads, config.head_dim),
        float("nan"),
        dtype=cache_dtype,
    )
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[order.pop() for _ in range(-(-(n + 1) // BLOCK))] for n in cached]
    for table, n in zip(tables, cached, strict=True):
        ids = torch.randint(0, config.vocab_size, (n,), generator=gen)
        model(ids, torch.arange(n), build_context([table], [0], [n], BLOCK), kv)
    ids = torch.randint(0, config.vocab_size, (len(cached),), generator=gen)
    return ids, torch.tensor(cached), build_context(tables, cached, [1] * len(cached), BLOCK), kv


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("arch", "fmt"),
    [("llama", None), ("qwen2", None), ("llama", "q4"), ("qwen2", "q8"), ("llama", "q8s")],
)
def test_one_call_decode_step_is_bit_identical_to_the_per_op_path(
    tmp_path: Path, monkeypatch, arch: str, fmt: str | None, cache_dtype: torch.dtype
):
    model, config = loaded(tmp_path, arch, fmt)
    assert model.decode_stack is not None
    ids, positions, ctx, kv = decode_inputs(model, config, cached=[3, 9, 16, 1], cache_dtype=cache_dtype)
    kv_per_op = kv.clone()
    stacked = model(ids, positions, ctx, kv)
    stack, model.decode_stack = model.decode_stack, None
    stores = []
    real_store = cpu_layer_ops.rotary_store
    monkeypatch.setattr(
        cpu_layer_ops, "rotary_store", lambda *a: stores.append(a[-1].dtype) or real_store(*a)
    )
    per_op = model(ids, positions, ctx, kv_per_op)
    model.decode_stack = stack
    assert stores == [cache_dtype] * config.num_layers  # the per-op path's C store, this pool's dtype
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


# ---- every buffer checked against the shape the stack was built for ----


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Callable:
    """``loaded`` once per (arch, fmt) for the tests below, which leave the model as it is."""
    models: dict = {}

    def get(arch: str, fmt: str | None):
        if (arch, fmt) not in models:
            models[arch, fmt] = loaded(tmp_path_factory.mktemp(arch), arch, fmt)
        return models[arch, fmt]

    return get


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values and shape in a layout that is not contiguous."""
    if t.dim() == 1:
        return torch.stack([t, t], dim=1)[:, 0]
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def with_linear(stack, i: int, name: str, change: Callable) -> list:
    """The stack's layers with layer ``i``'s product ``name`` replaced by ``change(it)``."""
    layers = list(stack.layers)
    layers[i] = dataclasses.replace(layers[i], **{name: change(getattr(layers[i], name))})
    return layers


def fp32_panels(change: Callable) -> Callable:
    return lambda w: dataclasses.replace(w, weight=change(w.weight))


def quant_panels(change: Callable, short_rows: int = 0) -> Callable:
    def apply(w):
        q = w.weight
        return dataclasses.replace(
            w, weight=cpu_quant.PackedQuant(q.fmt, change(q.data), q.out_features - short_rows, q.in_features)
        )

    return apply


FP32_LINEAR_CASES = {
    "qkv panels one panel short": ("qkv", fp32_panels(lambda d: d[:-1].contiguous())),
    "o panels one input short": ("o", fp32_panels(lambda d: d[:, :-1].contiguous())),
    "down panels one output short": ("down", fp32_panels(lambda d: d[..., :-1].contiguous())),
    "gate_up panels one panel short": ("gate_up", fp32_panels(lambda d: d[:-1].contiguous())),
    "gate_up panels of a plain weight": ("gate_up", fp32_panels(lambda d: d[: d.shape[0] // 2].contiguous())),
    "down panels float64": ("down", fp32_panels(lambda d: d.double())),
    "o panels not contiguous": ("o", fp32_panels(non_contiguous)),
    "qkv bias one element short": ("qkv", lambda w: dataclasses.replace(w, bias=w.bias[:-1].contiguous())),
    "qkv bias float64": ("qkv", lambda w: dataclasses.replace(w, bias=w.bias.double())),
    "o given a bias of the wrong length": ("o", lambda w: dataclasses.replace(w, bias=torch.zeros(3))),
    "gate_up given a bias": ("gate_up", lambda w: dataclasses.replace(w, bias=torch.zeros(1))),
}


@pytest.mark.parametrize("case", FP32_LINEAR_CASES)
def test_a_wrong_fp32_panel_or_bias_is_refused_naming_layer_and_buffer(built, case: str):
    model, _ = built("qwen2", None)  # qwen2: q/k/v biases
    stack = model.decode_stack
    name, change = FP32_LINEAR_CASES[case]
    with pytest.raises(ValueError, match=f"layer 1 {name}"):
        cpu_decode_stack.DecodeStack(with_linear(stack, 1, name, change), stack.final_norm, stack.shape)


QUANT_CASES = {
    "one panel of blocks short": ("down", quant_panels(lambda d: d[:-1].contiguous())),
    "one group of blocks short": ("qkv", quant_panels(lambda d: d[:, :-1].contiguous())),
    "one byte of a group's scales and quants short": ("o", quant_panels(lambda d: d[..., :-1].contiguous())),
    "blocks of a weight 16 rows short": (
        "gate_up",
        quant_panels(lambda d: d[:-1].contiguous(), short_rows=16),
    ),
    "blocks as int8": ("down", quant_panels(lambda d: d.view(torch.int8))),
    "blocks not contiguous": ("qkv", quant_panels(non_contiguous)),
    "a float tensor in place of blocks": (
        "o",
        lambda w: dataclasses.replace(w, weight=w.weight.dequantize()),
    ),
}


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("case", QUANT_CASES)
def test_wrong_quantized_blocks_or_scales_are_refused_naming_layer_and_buffer(built, fmt: str, case: str):
    model, _ = built("llama", fmt)
    stack = model.decode_stack
    name, change = QUANT_CASES[case]
    with pytest.raises(ValueError, match=f"layer 0 {name}"):
        cpu_decode_stack.DecodeStack(with_linear(stack, 0, name, change), stack.final_norm, stack.shape)


NORM_CASES = {
    "one element short": lambda n: n[:-1].contiguous(),
    "float64": lambda n: n.double(),
    "not contiguous": non_contiguous,
    "2-D": lambda n: n.view(1, -1),
}


@pytest.mark.parametrize("case", NORM_CASES)
@pytest.mark.parametrize("norm", ["input_norm", "post_norm", "final_norm"])
def test_a_wrong_norm_weight_is_refused_naming_it(built, norm: str, case: str):
    model, _ = built("llama", "q4")
    stack = model.decode_stack
    layers, final_norm = list(stack.layers), stack.final_norm
    if norm == "final_norm":
        final_norm = NORM_CASES[case](final_norm)
    else:
        layers[1] = dataclasses.replace(layers[1], **{norm: NORM_CASES[case](getattr(layers[1], norm))})
    with pytest.raises(ValueError, match=norm if norm == "final_norm" else f"layer 1 {norm}"):
        cpu_decode_stack.DecodeStack(layers, final_norm, stack.shape)


@pytest.mark.parametrize(
    "change",
    [
        {"kv_heads": 3},  # does not divide the query heads, nor match the panels
        {"head_dim": 0},
        {"q_heads": 2**31},  # past a C int
        {"intermediate": 64},  # the panels are for another size
    ],
)
def test_a_shape_the_panels_were_not_built_for_is_refused(built, change: dict):
    model, _ = built("llama", None)
    stack = model.decode_stack
    with pytest.raises(ValueError, match="shape|layer 0"):
        cpu_decode_stack.DecodeStack(
            stack.layers, stack.final_norm, dataclasses.replace(stack.shape, **change)
        )


def step_inputs(model, config) -> dict:
    ids, positions, ctx, kv = decode_inputs(model, config, cached=[3, 9])
    return {
        "hidden": model.model.embed_tokens(ids),
        "cos_sin": model.cos_sin_cache[positions],
        "slots": ctx.slot_mapping,
        "kv_cache": kv,
        "block_tables": ctx.block_tables,
        "context_lens": ctx.context_lens,
    }


def plus_2_32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as int64 with 2**32 added to its first value: narrowed to int32 it would
    wrap back to the original (valid) value."""
    t = t.long().clone()
    t.view(-1)[0] += 2**32
    return t


STEP_CASES = {
    "hidden one element short": ("hidden", lambda h: h[:, :-1].contiguous()),
    "hidden 1-D": ("hidden", lambda h: h[0]),
    "hidden 3-D": ("hidden", lambda h: h[None]),
    "hidden float64": ("hidden", lambda h: h.double()),
    "hidden not contiguous": ("hidden", non_contiguous),
    "hidden with no rows": ("hidden", lambda h: h[:0]),
    "cos_sin one element short": ("cos_sin", lambda c: c[:, :-1].contiguous()),
    "slots of floats": ("slots", lambda s: s.float()),
    "slots one short": ("slots", lambda s: s[:-1]),
    "block_tables one row short": ("block_tables", lambda t: t[:-1]),
    "block_tables 1-D": ("block_tables", lambda t: t[0]),
    "context_lens of floats": ("context_lens", lambda n: n.float()),
    "a block id past 32 bits": ("block_tables", plus_2_32),
    "a context length past 32 bits": ("context_lens", plus_2_32),
    "a negative 64-bit context length": ("context_lens", lambda n: n.long() - 100),
    "kv_cache float64": ("kv_cache", lambda kv: kv.double()),
    "kv_cache bfloat16": ("kv_cache", lambda kv: kv.bfloat16()),
    "kv_cache with 2**31 blocks": ("kv_cache", lambda kv: kv[:1].expand(2**31, *kv.shape[1:])),
}


@pytest.mark.parametrize("case", STEP_CASES)
def test_a_wrong_step_input_is_refused_before_the_c_call(built, monkeypatch, case: str):
    model, config = built("llama", "q8")
    args = step_inputs(model, config)
    name, change = STEP_CASES[case]
    args[name] = change(args[name])

    def no_c_call(*_):
        raise AssertionError("the C kernel was reached")

    monkeypatch.setattr(cpu_build, "require", no_c_call)
    with pytest.raises(ValueError, match=name):
        model.decode_stack(**args)


def test_int64_step_inputs_within_32_bits_run_like_int32_ones(built):
    model, config = built("llama", "q8")
    args = step_inputs(model, config)
    wide = dict(args, hidden=args["hidden"].clone(), kv_cache=args["kv_cache"].clone())
    wide["block_tables"], wide["context_lens"] = args["block_tables"].long(), args["context_lens"].long()
    assert torch.equal(model.decode_stack(**wide), model.decode_stack(**args))
