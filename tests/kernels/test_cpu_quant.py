"""GGUF block-quantized weights (``inference.runner.gguf.blocks``, ``chatsite_kernels.cpu.quant``):
our repacked blocks de-quantize to exactly gguf-py's values (what transformers' GGUF
loader calls), and the C kernel's products match ``F.linear`` on those values within
fp32 rounding.

The blocks are written to a small GGUF file with the ``gguf`` package and read back
as the engine reads them. Their bytes are random (every bit pattern a block can hold)
except the f16 scales, kept finite and small."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, dequantize

from chatsite_kernels.cpu import quant as cpu_quant
from inference.runner.gguf.blocks import GGUF_TYPES, parse_gguf_blocks

TYPES = list(GGUF_TYPES)


@pytest.fixture(autouse=True)
def c_kernel_is_built() -> None:
    assert cpu_quant.available(), "the C quantized kernel did not build (is gcc installed? see the log)"


def random_blocks(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """uint8 ``[n, row bytes]``: random block bytes with finite f16 scales."""
    rng = np.random.default_rng(seed)
    _, block, block_bytes = GGUF_TYPES[type_name]
    raw = rng.integers(0, 256, size=(n, k // block, block_bytes), dtype=np.uint8)
    f16_fields = {"Q6_K": [208], "Q4_1": [0, 2], "Q4_K": [0, 2]}.get(type_name, [0])
    for start in f16_fields:
        values = (rng.standard_normal((n, k // block)) * 0.02).astype(np.float16)
        raw[..., start : start + 2] = values.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)


def write_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray, tuple[int, int]]]) -> None:
    writer = GGUFWriter(str(path), "llama")
    for name, (type_name, raw, _shape) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[type_name])  # shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, np.ndarray, tuple]]:
    """One [40, 512] tensor per type, written to a GGUF file and read back."""
    path = tmp_path_factory.mktemp("gguf") / "blocks.gguf"
    tensors = {t: (t, random_blocks(t, 40, 512, seed=i), (40, 512)) for i, t in enumerate(TYPES)}
    write_gguf(path, tensors)
    reader = GGUFReader(str(path))
    return {
        t.name: (t.tensor_type.name, np.asarray(t.data), tuple(int(d) for d in t.shape[::-1]))
        for t in reader.tensors
    }


@pytest.mark.parametrize("type_name", TYPES)
def test_repacked_blocks_dequantize_to_gguf_values_exactly(gguf_weights, type_name: str) -> None:
    gguf_type, raw, shape = gguf_weights[type_name]
    assert gguf_type == type_name
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType[type_name]).reshape(shape))
    packed = cpu_quant.pack(parse_gguf_blocks(type_name, raw, shape))
    assert packed.data.dtype == torch.uint8
    assert torch.equal(packed.dequantize(), expected)
    ids = torch.tensor([[0, 39], [17, 16]])
    assert torch.equal(cpu_quant.embedding(ids, packed), expected[ids])


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if bias is None else bias.double()).float()


def assert_fp32_close(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    # fp32 rounding of a K-term dot product: a few ulps of sum |x| |w| per output.
    bound = (x.abs().double() @ w.abs().double().T).float() * 2e-6 + 1e-6
    assert out.shape == ref.shape
    assert ((out - ref).abs() <= bound).all(), (out - ref).abs().max()


# Rows around the register tiles (6 rows; 12 with AVX-512, several tiles over a panel
# above) and the buffered path; outputs not a multiple of 16.
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize(
    ("rows", "outputs", "inner"),
    [(1, 37, 256), (5, 40, 512), (7, 23, 768), (12, 48, 256), (13, 20, 512), (25, 33, 256), (301, 50, 256)],
)
def test_quant_linear_matches_f_linear(type_name: str, rows: int, outputs: int, inner: int) -> None:
    raw = random_blocks(type_name, outputs, inner, seed=rows + outputs)
    packed = cpu_quant.pack(parse_gguf_blocks(type_name, raw, (outputs, inner)))
    w = packed.dequantize()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, inner, generator=gen)
    bias = torch.randn(outputs, generator=gen) if rows % 2 else None
    out = cpu_quant.linear(x, packed, bias)
    assert_fp32_close(out, reference(x, w, bias), x, w)


@pytest.mark.parametrize("type_name", TYPES)
def test_a_rows_output_does_not_depend_on_the_rows_beside_it(type_name: str) -> None:
    # What keeps a verified speculative proposal's logits those of plain decoding.
    packed = cpu_quant.pack(parse_gguf_blocks(type_name, random_blocks(type_name, 40, 512, 5), (40, 512)))
    x = torch.randn(30, 512, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(40, generator=torch.Generator().manual_seed(6))
    alone = torch.cat([cpu_quant.linear(x[i : i + 1], packed, bias) for i in range(len(x))])
    limit = cpu_quant.row_independent_max()
    assert limit >= 6
    for rows in range(2, min(limit, len(x)) + 1):
        assert torch.equal(cpu_quant.linear(x[:rows], packed, bias), alone[:rows]), rows


@pytest.mark.parametrize("rows", [1, 6, 13, 30])
def test_fused_gate_up_silu(rows: int) -> None:
    gate_raw, up_raw = random_blocks("Q4_1", 24, 256, 1), random_blocks("Q4_1", 24, 256, 2)
    gate = parse_gguf_blocks("Q4_1", gate_raw, (24, 256))
    up = parse_gguf_blocks("Q4_1", up_raw, (24, 256))
    packed = cpu_quant.pack(cpu_quant.interleave_gate_up(gate, up))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    out = cpu_quant.linear(x, packed, silu_pairs=True)
    expected = F.silu(reference(x, gate.dequantize())) * reference(x, up.dequantize())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_strided_rows_and_leading_dimensions() -> None:
    packed = cpu_quant.pack(parse_gguf_blocks("Q8_0", random_blocks("Q8_0", 20, 64, 3), (20, 64)))
    base = torch.randn(2, 5, 100)
    x = base[..., 10:74]
    torch.testing.assert_close(
        cpu_quant.linear(x, packed), reference(x, packed.dequantize()), rtol=1e-5, atol=1e-5
    )


def test_bad_arguments_are_refused_by_name() -> None:
    packed = cpu_quant.pack(parse_gguf_blocks("Q8_0", random_blocks("Q8_0", 20, 64, 4), (20, 64)))
    with pytest.raises(ValueError, match="x:"):
        cpu_quant.linear(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="x:"):
        cpu_quant.linear(torch.randn(2, 64, dtype=torch.float64), packed)
    with pytest.raises(ValueError, match="bias:"):
        cpu_quant.linear(torch.randn(2, 64), packed, torch.randn(19))
    with pytest.raises(ValueError, match="silu_pairs"):
        cpu_quant.linear(torch.randn(2, 64), packed, silu_pairs=True)
    with pytest.raises(ValueError, match="ids:"):
        cpu_quant.embedding(torch.tensor([20]), packed)
    truncated = cpu_quant.PackedQuant(packed.fmt, packed.data[:1], packed.out_features, packed.in_features)
    with pytest.raises(ValueError, match="packed:"):
        cpu_quant.linear(torch.randn(2, 64), truncated)
    with pytest.raises(ValueError, match="does not fit"):
        parse_gguf_blocks("Q4_K", random_blocks("Q4_K", 4, 256, 5)[:, :-1], (4, 256))
