"""MXFP4 de-quantization (``inference.runner.mxfp4``) against a decoder written from the
OCP Microscaling spec in the test support (``tests.support.mxfp4_spec``), in both layouts
gpt-oss ships: safetensors ``*_blocks``/``*_scales`` and GGUF type MXFP4 (checked against
the bytes gguf-py's own quantizer writes too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.models.gpt_oss import dequantize_experts
from inference.runner.mxfp4 import E2M1_VALUES, dequantize_blocks, dequantize_gguf
from tests.support.mxfp4_spec import (
    dequantize_gguf_mxfp4,
    dequantize_mxfp4,
    e2m1_value,
    quantize_mxfp4,
)


def test_the_e2m1_table_is_the_specs() -> None:
    assert E2M1_VALUES == tuple(e2m1_value(code) for code in range(16))
    assert e2m1_value(0b0111) == 6.0 and e2m1_value(0b0001) == 0.5 and e2m1_value(0b1101) == -3.0


def test_every_code_and_scale_decodes_as_the_spec_says() -> None:
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(100, 150, (3, 5, 4), dtype=torch.uint8, generator=gen)
    scales[0, 0, 0], scales[0, 0, 1] = 0, 254  # the extremes: 2**-127 and 2**127
    ours = dequantize_blocks(blocks, scales)
    assert ours.shape == (3, 5, 128)
    assert torch.equal(ours, dequantize_mxfp4(blocks, scales))


def test_quantized_values_round_trip_exactly() -> None:
    x = torch.randn(4, 64) * 3
    blocks, scales = quantize_mxfp4(x)
    values = dequantize_blocks(blocks, scales)
    assert torch.equal(dequantize_blocks(*quantize_mxfp4(values)), values)  # already on the grid
    assert (values - x).abs().max() <= x.abs().max() / 4  # within a step of the coarsest block


def test_the_gguf_layout_decodes_as_the_spec_and_as_gguf_py() -> None:
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    x = np.random.default_rng(1).normal(size=(3, 96)).astype(np.float32)
    raw = gguf_quants.quantize(x, GGMLQuantizationType.MXFP4)  # gguf-py's writer: [3, 3 * 17] bytes
    ours = dequantize_gguf(torch.from_numpy(raw), 96)
    spec = [dequantize_gguf_mxfp4(bytes(row), 96) for row in raw]
    assert torch.equal(ours, torch.tensor(spec))
    assert torch.equal(ours, torch.from_numpy(gguf_quants.dequantize(raw, GGMLQuantizationType.MXFP4)))


def test_expert_weights_in_the_checkpoint_layout_become_hfs_tensors() -> None:
    weight = torch.randn(2, 64, 32)  # HF's [E, in, out]
    blocks, scales = quantize_mxfp4(weight.transpose(-1, -2))  # checkpoints: [E, out, in / 32, 16]
    state = dequantize_experts({"x.gate_up_proj_blocks": blocks, "x.gate_up_proj_scales": scales})
    assert set(state) == {"x.gate_up_proj"}
    assert torch.equal(state["x.gate_up_proj"], dequantize_mxfp4(blocks, scales).transpose(-1, -2))
    with pytest.raises(KeyError, match="_scales"):
        dequantize_experts({"x.down_proj_blocks": blocks})
