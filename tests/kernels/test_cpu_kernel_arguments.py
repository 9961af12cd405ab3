"""Every C kernel's wrapper refuses a wrong call with a ValueError naming the argument,
before the call: wrong dtypes, devices, layouts and shapes never reach the C side
(where they would read or write out of bounds)."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels.cpu import decode as cpu_decode
from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from chatsite_kernels.cpu import linear as cpu_linear

pytestmark = pytest.mark.skipif(
    not (cpu_decode.available() and cpu_layer_ops.available() and cpu_linear.available()),
    reason="the C kernels did not build (tests/kernels/test_cpu_build.py says why)",
)

B, HQ, HKV, D, BLOCKS, BS = 2, 4, 2, 8, 6, 4


def decode_args() -> dict:
    return {
        "query": torch.randn(B, HQ, D),
        "k_cache": torch.randn(BLOCKS, BS, HKV, D),
        "v_cache": torch.randn(BLOCKS, BS, HKV, D),
        "block_tables": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "context_lens": torch.tensor([5, 7], dtype=torch.int32),
        "scale": 0.3,
    }


def rotary_args(tokens: int = 3) -> dict:
    return {
        "qkv": torch.randn(tokens, (HQ + 2 * HKV) * D),
        "num_heads": HQ,
        "num_kv_heads": HKV,
        "cos_sin": torch.randn(tokens, D),
        "slot_mapping": torch.arange(tokens),
        "k_cache": torch.zeros(BLOCKS, BS, HKV, D),
        "v_cache": torch.zeros(BLOCKS, BS, HKV, D),
    }


def linear_args() -> dict:
    return {
        "x": torch.randn(3, 24),
        "packed": cpu_linear.pack_weight(torch.randn(40, 24)),
        "out_features": 40,
        "bias": torch.randn(40),
    }


def test_the_valid_calls_used_below_run() -> None:
    assert cpu_decode.paged_decode_attention_cpu(**decode_args()).shape == (B, HQ, D)
    cpu_layer_ops.rotary_store(**rotary_args())
    assert cpu_linear.linear_packed(**linear_args()).shape == (3, 40)
    assert cpu_layer_ops.rms_norm(torch.randn(3, 16), torch.ones(16), 1e-6).shape == (3, 16)
    assert cpu_layer_ops.argmax_rows(torch.randn(3, 16)).shape == (3,)


DECODE_CASES = {
    "query float64": ("query", lambda a: a["query"].double()),
    "query 2-D": ("query", lambda a: a["query"][:, 0]),
    "query on the meta device": ("query", lambda a: a["query"].to("meta")),
    "k_cache bfloat16": ("k_cache", lambda a: a["k_cache"].bfloat16()),
    "v_cache float16 beside an fp32 k_cache": ("v_cache", lambda a: a["v_cache"].half()),
    "k_cache with the wrong head size": ("k_cache", lambda a: torch.randn(BLOCKS, BS, HKV, D + 1)),
    "k_cache head count not dividing the query's": ("k_cache", lambda a: torch.randn(BLOCKS, BS, 3, D)),
    "k_cache with a strided head dimension": (
        "k_cache",
        lambda a: torch.randn(BLOCKS, BS, HKV, 2 * D)[..., ::2],
    ),
    "v_cache of another shape": ("v_cache", lambda a: torch.randn(BLOCKS + 1, BS, HKV, D)),
    "block_tables of floats": ("block_tables", lambda a: a["block_tables"].float()),
    "block_tables with fewer rows than the batch": ("block_tables", lambda a: a["block_tables"][:1]),
    "context_lens shorter than the batch": ("context_lens", lambda a: a["context_lens"][:1]),
    "context_lens of floats": ("context_lens", lambda a: a["context_lens"].float()),
}


@pytest.mark.parametrize("case", DECODE_CASES)
def test_paged_decode_attention_refuses_a_wrong_argument(case: str) -> None:
    name, change = DECODE_CASES[case]
    args = decode_args()
    args[name] = change(args)
    with pytest.raises(ValueError, match=name):
        cpu_decode.paged_decode_attention_cpu(**args)


ROTARY_CASES = {
    "qkv float64": ("qkv", lambda a: a["qkv"].double()),
    "qkv with the wrong width": ("qkv", lambda a: torch.randn(3, (HQ + 2 * HKV) * D - 1)),
    "cos_sin with fewer rows than tokens": ("cos_sin", lambda a: a["cos_sin"][:2]),
    "cos_sin with more rows than tokens": ("cos_sin", lambda a: torch.randn(4, D)),
    "cos_sin with an odd head size": ("cos_sin", lambda a: torch.randn(3, 7)),
    "slot_mapping shorter than the tokens": ("slot_mapping", lambda a: a["slot_mapping"][:2]),
    "slot_mapping of floats": ("slot_mapping", lambda a: a["slot_mapping"].float()),
    "k_cache with the wrong head count": ("k_cache", lambda a: torch.zeros(BLOCKS, BS, HKV + 1, D)),
    "k_cache int32": ("k_cache", lambda a: a["k_cache"].int()),
    "k_cache bfloat16": ("k_cache", lambda a: a["k_cache"].bfloat16()),
    "v_cache float16 beside an fp32 k_cache": ("v_cache", lambda a: a["v_cache"].half()),
    "k_cache with the wrong head size": ("k_cache", lambda a: torch.zeros(BLOCKS, BS, HKV, D * 2)),
    "v_cache of another shape": ("v_cache", lambda a: torch.zeros(BLOCKS, BS + 1, HKV, D)),
    "v_cache 3-D": ("v_cache", lambda a: torch.zeros(BLOCKS, BS, HKV * D)),
}


@pytest.mark.parametrize("case", ROTARY_CASES)
def test_rotary_store_refuses_a_wrong_argument(case: str) -> None:
    name, change = ROTARY_CASES[case]
    args = rotary_args()
    args[name] = change(args)
    with pytest.raises(ValueError, match=name):
        cpu_layer_ops.rotary_store(**args)


def test_rotary_store_reports_a_slot_outside_the_cache_without_writing_it() -> None:
    args = rotary_args()
    args["slot_mapping"] = torch.tensor([0, 1, BLOCKS * BS + 5])
    with pytest.raises(ValueError, match="slot"):
        cpu_layer_ops.rotary_store(**args)


RMS_CASES = {
    "x float64": ("x", lambda: (torch.randn(3, 16).double(), torch.ones(16), None)),
    "x with an empty last dimension": ("x", lambda: (torch.randn(3, 0), torch.ones(0), None)),
    "weight shorter than a row": ("weight", lambda: (torch.randn(3, 16), torch.ones(15), None)),
    "weight longer than a row": ("weight", lambda: (torch.randn(3, 16), torch.ones(17), None)),
    "weight float16": ("weight", lambda: (torch.randn(3, 16), torch.ones(16).half(), None)),
    "residual with fewer rows": (
        "residual",
        lambda: (torch.randn(3, 16), torch.ones(16), torch.zeros(2, 16)),
    ),
    "residual not contiguous": (
        "residual",
        lambda: (torch.randn(3, 16), torch.ones(16), torch.zeros(16, 3).t()),
    ),
    "residual float64": (
        "residual",
        lambda: (torch.randn(3, 16), torch.ones(16), torch.zeros(3, 16).double()),
    ),
}


@pytest.mark.parametrize("case", RMS_CASES)
def test_rms_norm_refuses_a_wrong_argument(case: str) -> None:
    name, make = RMS_CASES[case]
    x, weight, residual = make()
    with pytest.raises(ValueError, match=name):
        cpu_layer_ops.rms_norm(x, weight, 1e-6, residual=residual)


def test_rms_norm_reads_a_non_contiguous_weight_through_a_kept_copy() -> None:
    x, weight = torch.randn(5, 16), torch.rand(32)[::2]
    expected = torch.nn.functional.rms_norm(x, (16,), weight.contiguous(), 1e-6)
    torch.testing.assert_close(cpu_layer_ops.rms_norm(x, weight, 1e-6), expected)


@pytest.mark.parametrize(
    "x", [torch.randn(3, 16).double(), torch.randn(16), torch.randn(2, 3, 16), torch.randn(3, 0)]
)
def test_argmax_rows_refuses_a_wrong_x(x: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="x"):
        cpu_layer_ops.argmax_rows(x)


LINEAR_CASES = {
    "x with the wrong inner size": ("x", lambda a: torch.randn(3, 23)),
    "x float64": ("x", lambda a: a["x"].double()),
    "x 0-D": ("x", lambda a: torch.tensor(1.0)),
    "packed float64": ("packed", lambda a: a["packed"].double()),
    "packed 2-D": ("packed", lambda a: torch.randn(40, 24)),
    "packed for fewer outputs": ("packed", lambda a: cpu_linear.pack_weight(torch.randn(16, 24))),
    "bias shorter than the outputs": ("bias", lambda a: torch.randn(39)),
    "bias float64": ("bias", lambda a: a["bias"].double()),
    "bias 2-D": ("bias", lambda a: a["bias"].view(2, 20)),
}


@pytest.mark.parametrize("case", LINEAR_CASES)
def test_linear_packed_refuses_a_wrong_argument(case: str) -> None:
    name, change = LINEAR_CASES[case]
    args = linear_args()
    args[name] = change(args)
    with pytest.raises(ValueError, match=name):
        cpu_linear.linear_packed(**args)


def test_linear_packed_reads_a_non_contiguous_bias_through_a_kept_copy() -> None:
    args = linear_args()
    weight = torch.randn(40, 24)
    args["packed"], args["bias"] = cpu_linear.pack_weight(weight), torch.randn(80)[::2]
    expected = torch.nn.functional.linear(args["x"], weight, args["bias"].contiguous())
    torch.testing.assert_close(cpu_linear.linear_packed(**args), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "name,x,packed",
    [
        ("x", torch.randn(3, 23), None),
        ("x", torch.randn(3, 24).double(), None),
        ("packed", torch.randn(3, 24), torch.randn(5, 24, 16).double()),
        ("packed", torch.randn(3, 24), torch.randn(1, 24, 16)),
    ],
)
def test_gate_up_silu_refuses_a_wrong_argument(name: str, x: torch.Tensor, packed) -> None:
    if packed is None:
        packed = cpu_linear.pack_gate_up(torch.randn(40, 24), torch.randn(40, 24))
    with pytest.raises(ValueError, match=name):
        cpu_linear.gate_up_silu(x, packed, 40)


# ---- sizes and indices the C side takes as 32-bit ints ----
# Each is checked before it is narrowed: an int64 2**32 + 1 would arrive as block 1 (a
# valid but wrong block), a size of 2**31 as a negative one. The huge sizes are
# expanded views (no memory), which a caller can pass as easily as real tensors.

BIG = 2**31


def wide(t: torch.Tensor, value: int) -> torch.Tensor:
    """``t`` as int64 with ``value`` as its first element."""
    t = t.long().clone()
    t.view(-1)[0] = value
    return t


DECODE_32_BIT_CASES = {
    "a block id that wraps to a valid one": ("block_tables", lambda a: wide(a["block_tables"], 2**32 + 1)),
    "a block id of 2**31": ("block_tables", lambda a: wide(a["block_tables"], BIG)),
    "a negative 64-bit block id": ("block_tables", lambda a: wide(a["block_tables"], -(2**32) + 1)),
    "a context length that wraps to a valid one": (
        "context_lens",
        lambda a: wide(a["context_lens"], 2**32 + 5),
    ),
    "a negative 64-bit context length": ("context_lens", lambda a: wide(a["context_lens"], -1)),
    "2**31 blocks": ("k_cache", lambda a: a["k_cache"][:1].expand(BIG, BS, HKV, D)),
    "a block size of 2**31": ("k_cache", lambda a: a["k_cache"][:, :1].expand(BLOCKS, BIG, HKV, D)),
    "a block table 2**31 wide": ("block_tables", lambda a: a["block_tables"][:, :1].expand(B, BIG)),
}


@pytest.mark.parametrize("case", DECODE_32_BIT_CASES)
def test_paged_decode_attention_refuses_a_size_or_index_past_32_bits(case: str) -> None:
    name, change = DECODE_32_BIT_CASES[case]
    args = decode_args()
    args[name] = change(args)
    if name == "k_cache":
        args["v_cache"] = change({"k_cache": args["v_cache"]})
    with pytest.raises(ValueError, match=name):
        cpu_decode.paged_decode_attention_cpu(**args)


def test_paged_decode_attention_refuses_2_31_sequences() -> None:
    args = decode_args()
    args["query"] = args["query"][:1].expand(BIG, HQ, D)
    args["block_tables"] = args["block_tables"][:1].expand(BIG, 2)
    args["context_lens"] = args["context_lens"][:1].expand(BIG)
    with pytest.raises(ValueError, match="query: the number of sequences"):
        cpu_decode.paged_decode_attention_cpu(**args)


def test_paged_decode_attention_takes_int64_indices_within_32_bits_as_int32_ones() -> None:
    args = decode_args()
    expected = cpu_decode.paged_decode_attention_cpu(**args)
    args["block_tables"], args["context_lens"] = args["block_tables"].long(), args["context_lens"].long()
    assert torch.equal(cpu_decode.paged_decode_attention_cpu(**args), expected)


def test_rotary_store_refuses_a_block_size_of_2_31() -> None:
    args = rotary_args()
    args["k_cache"] = args["k_cache"][:, :1].expand(BLOCKS, BIG, HKV, D)
    args["v_cache"] = args["v_cache"][:, :1].expand(BLOCKS, BIG, HKV, D)
    with pytest.raises(ValueError, match="k_cache: the block size"):
        cpu_layer_ops.rotary_store(**args)
