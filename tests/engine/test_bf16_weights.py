"""bf16 copies of the CPU weights (``inference.layers.bf16_weights``): a product of at
least ``min_rows`` rows is exactly ``F.linear`` in bf16 on the de-quantized (or fp32)
weight, with an fp32 result and the bias added in fp32; fewer rows keep the
quantized/fp32 kernels bit for bit; the fp32 policy drops every copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import QuantRows
from inference.layers import bf16_weights
from inference.layers.cpu_matmul import CpuMatmul
from inference.layers.gqa_attention import Attention
from inference.layers.linear import Linear
from inference.layers.mlp import MLP
from inference.model_config import ModelConfig

MIN_ROWS = 16
HIDDEN, INTER = 64, 96


def bf16_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16)).float()
    return out if bias is None else out + bias


def random_q4(n: int, k: int, seed: int) -> QuantRows:
    gen = torch.Generator().manual_seed(seed)
    groups = k // cpu_quant.GROUP["q4"]
    return QuantRows(
        "q4",
        torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int8),
        torch.rand(n, groups, generator=gen) * 0.02,
        torch.randn(n, groups, generator=gen) * 0.05,
    )


def config(**overrides: object) -> ModelConfig:
    fields: dict[str, object] = dict(
        architecture="LlamaForCausalLM", vocab_size=128, hidden_size=HIDDEN, intermediate_size=INTER,
        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling=None, max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
    )  # fmt: skip
    return ModelConfig(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def kernels_are_built() -> None:
    assert cpu_quant.available(), "the C quantized kernel did not build"


@pytest.mark.parametrize("rows", [1, MIN_ROWS - 1, MIN_ROWS, 54])
def test_a_quantized_linear_uses_bf16_from_min_rows_on(rows: int) -> None:
    linear = Linear(HIDDEN, 48, bias=True)
    packed = cpu_quant.pack(random_q4(48, HIDDEN, seed=1))
    linear.set_quantized(packed)
    with torch.no_grad():
        linear.bias.normal_()
    assert linear.prepare_bf16(MIN_ROWS) == 48 * HIDDEN * 2
    x = torch.randn(rows, HIDDEN)
    with torch.inference_mode():
        got = linear(x)
    if rows >= MIN_ROWS:
        expected = bf16_reference(x, packed.dequantize(), linear.bias)
    else:
        expected = cpu_quant.linear(x, packed, linear.bias)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


def test_an_fp32_linear_released_after_packing_uses_bf16_of_its_weight() -> None:
    linear = Linear(HIDDEN, 40, bias=False)
    weight = linear.weight.detach().clone()
    linear.prepare_packed()
    linear.release_weight()
    linear.prepare_bf16(MIN_ROWS)
    x = torch.randn(MIN_ROWS, HIDDEN)
    with torch.inference_mode():
        assert torch.equal(linear(x), bf16_reference(x, weight))


def test_the_fused_quantized_gate_up_keeps_gate_and_up_apart() -> None:
    mlp = MLP(config())
    gate, up, down = random_q4(INTER, HIDDEN, 2), random_q4(INTER, HIDDEN, 3), random_q4(HIDDEN, INTER, 4)
    mlp.set_quantized({"gate_proj": gate, "up_proj": up, "down_proj": down})
    assert mlp._gate_up_quant is not None  # the interleaved layout is what is under test
    mlp.prepare_bf16(MIN_ROWS)
    x = torch.randn(20, HIDDEN)
    both = bf16_reference(x, torch.cat([gate.dequantize(), up.dequantize()]))
    hidden = F.silu(both[:, :INTER]) * both[:, INTER:]
    with torch.inference_mode():
        assert torch.equal(mlp(x), bf16_reference(hidden, down.dequantize()))


def test_the_fused_quantized_qkv_carries_its_biases_in_fp32() -> None:
    attention = Attention(config(attention_bias=True), layer_idx=0)
    rows = {
        name: random_q4(n, HIDDEN, i)
        for i, (name, n) in enumerate([("q_proj", 64), ("k_proj", 32), ("v_proj", 32)])
    }
    attention.set_quantized(rows)
    with torch.no_grad():
        for p in (attention.q_proj, attention.k_proj, attention.v_proj):
            p.bias.normal_()
    attention.prepare_bf16(MIN_ROWS)
    x = torch.randn(MIN_ROWS, HIDDEN)
    weight = torch.cat([rows[n].dequantize() for n in ("q_proj", "k_proj", "v_proj")])
    bias = torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
    with torch.inference_mode():
        assert torch.equal(attention.fused_qkv(x), bf16_reference(x, weight, bias))


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(config())
        self.lm_head = Linear(HIDDEN, 128, bias=False)


def test_attach_skips_the_lm_head_and_the_fp32_policy_drops_every_copy() -> None:
    model = TwoLayers()
    held = bf16_weights.attach(model, CpuMatmul(bf16=True))
    assert held == 3 * HIDDEN * INTER * 2  # gate, up and down; no LM head
    assert model.lm_head.bf16 is None and model.mlp.down_proj.bf16 is not None
    assert bf16_weights.attach(model, CpuMatmul(bf16=False)) == 0
    assert model.mlp.down_proj.bf16 is None and model.mlp.gate_proj.bf16 is None
