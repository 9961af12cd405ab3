"""The packed C GEMM (``chatsite_kernels.cpu.linear``) against ``torch.nn.functional.linear``,
and the model's linear layers using it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from chatsite_kernels.cpu import linear as cpu_linear
from inference.layers.linear import Linear


@pytest.fixture(autouse=True)
def c_kernel_is_built() -> None:
    assert cpu_linear.available(), "the C linear kernel did not build (is gcc installed? see the log)"


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


# Rows around the 6-row tile and the row blocks; outputs around the 16-wide panel;
# inner sizes that are not a multiple of the 8-float vector.
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 64, 301])
@pytest.mark.parametrize(("outputs", "inner"), [(16, 8), (40, 24), (7, 3), (576, 576), (33, 1537)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_torch(rows: int, outputs: int, inner: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + outputs + inner)
    x = torch.randn(rows, inner, generator=gen)
    w = torch.randn(outputs, inner, generator=gen) / inner**0.5
    b = torch.randn(outputs, generator=gen) if bias else None
    out = cpu_linear.linear_packed(x, cpu_linear.pack_weight(w), outputs, b)
    assert out.shape == (rows, outputs)
    torch.testing.assert_close(out, reference(x, w, b), rtol=1e-5, atol=1e-5)


def test_no_rows_and_leading_dimensions() -> None:
    w = torch.randn(20, 12)
    packed = cpu_linear.pack_weight(w)
    assert cpu_linear.linear_packed(torch.empty(0, 12), packed, 20).shape == (0, 20)
    x = torch.randn(2, 3, 12)
    torch.testing.assert_close(cpu_linear.linear_packed(x, packed, 20), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_strided_rows_are_read_in_place() -> None:
    """Hidden states of sampled rows, or a column slice: rows with a stride > width."""
    base = torch.randn(9, 50)
    x = base[::2, 5:37]  # 5 rows of 32, row stride 100
    w = torch.randn(24, 32)
    torch.testing.assert_close(
        cpu_linear.linear_packed(x, cpu_linear.pack_weight(w), 24), F.linear(x, w), rtol=1e-5, atol=1e-5
    )


def test_pack_layout_is_panels_of_sixteen_outputs() -> None:
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = cpu_linear.pack_weight(w)
    assert packed.shape == (2, 3, 16)
    assert torch.equal(packed[0, :, 5], w[5])
    assert torch.equal(packed[1, :, 3], w[19])
    assert torch.equal(packed[1, :, 4:], torch.zeros(3, 12))  # padding past N


def test_a_wrong_packed_weight_is_refused() -> None:
    packed = cpu_linear.pack_weight(torch.randn(20, 12))
    with pytest.raises(ValueError, match="pack_weight"):
        cpu_linear.linear_packed(torch.randn(2, 12), packed, 40)


def test_model_linear_uses_the_kernel_and_repacks_a_changed_weight(monkeypatch) -> None:
    layer = Linear(32, 48, bias=True)
    calls = []
    real = cpu_linear.linear_packed
    monkeypatch.setattr(cpu_linear, "linear_packed", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(4, 32)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), reference(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert calls
        layer.weight.mul_(2)  # in place: same storage, new version
        torch.testing.assert_close(layer(x), reference(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        layer.weight = torch.nn.Parameter(
            torch.randn(48, 32), requires_grad=False
        )  # replaced (an inference tensor)
        torch.testing.assert_close(layer(x), reference(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_autograd_and_other_dtypes_use_torch() -> None:
    layer = Linear(16, 16)
    assert not cpu_linear.supports(torch.randn(2, 16, requires_grad=True), layer.weight, layer.bias)
    assert not cpu_linear.supports(torch.randn(2, 16, dtype=torch.bfloat16), layer.weight.bfloat16(), None)
    out = layer(torch.randn(2, 16))  # grad mode, a trainable weight: torch keeps the graph
    assert out.requires_grad


@pytest.mark.parametrize("rows", [1, 4, 6, 11, 64, 200])
@pytest.mark.parametrize(("outputs", "inner"), [(8, 8), (36, 20), (5, 3), (1536, 576)])
def test_fused_gate_up_silu_matches_torch(rows: int, outputs: int, inner: int) -> None:
    gen = torch.Generator().manual_seed(rows + outputs * 7 + inner)
    x = torch.randn(rows, inner, generator=gen) * 2
    gate = torch.randn(outputs, inner, generator=gen) / inner**0.5
    up = torch.randn(outputs, inner, generator=gen) / inner**0.5
    out = cpu_linear.gate_up_silu(x, cpu_linear.pack_gate_up(gate, up), outputs)
    ref = F.silu(reference(x, gate, None).double()) * reference(x, up, None).double()
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


def test_fused_silu_saturates_without_overflow() -> None:
    """Gate pre-activations far past exp's range: silu(g) -> g for g >> 0, -> 0 for g << 0."""
    x = torch.tensor([[1.0], [-1.0], [0.0]])
    gate = torch.tensor([[200.0], [-200.0], [30.0], [-30.0], [0.5], [-0.5], [1e-3], [-1e-3]])
    up = torch.ones(8, 1)
    out = cpu_linear.gate_up_silu(x, cpu_linear.pack_gate_up(gate, up), 8)
    torch.testing.assert_close(out, F.silu(F.linear(x, gate)) * F.linear(x, up), rtol=1e-6, atol=1e-30)
    assert torch.isfinite(out).all()


def test_model_mlp_uses_the_fused_kernel(monkeypatch) -> None:
    from inference.layers.mlp import MLP

    mlp = MLP(SimpleNamespace(hidden_size=32, intermediate_size=40, mlp_bias=False))
    calls = []
    real = cpu_linear.gate_up_silu
    monkeypatch.setattr(cpu_linear, "gate_up_silu", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(5, 32)
    with torch.inference_mode():
        expected = F.linear(
            F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight), mlp.down_proj.weight
        )
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
    assert calls


def test_engine_start_packs_the_weights_before_the_first_request(tmp_path) -> None:
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from tests.support.fakes import make_tiny_model_dir

    path = make_tiny_model_dir(tmp_path / "tiny", arch="qwen2", seed=1)  # q/k/v biases too
    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", num_kv_blocks=8))
    model = engine.runner.model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn._packed is not None and attn._packed[1] is not None  # the q/k/v biases, concatenated
    assert mlp._packed is not None and mlp.down_proj._packed is not None
    assert model.lm_head._packed is not None
