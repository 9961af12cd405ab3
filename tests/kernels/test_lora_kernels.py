"""The batched LoRA shrink and expand: the C kernel and the Triton kernel (in its
interpreter without a GPU) against the PyTorch references, on batches mixing adapters of
different ranks (zero-padded in the stacks) with base rows."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels.cpu import lora as cpu_lora
from chatsite_kernels.reference import lora_expand_ref, lora_shrink_ref
from tests.kernels.cases import DEVICE, requires_backend


def _case(t: int = 11, k: int = 96, n: int = 80, ranks=(8, 16), seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    s, r = len(ranks), max(ranks)
    a = torch.zeros(s, r, k)
    b = torch.zeros(s, n, r)
    for i, rank in enumerate(ranks):  # ranks below the largest are zero-padded
        a[i, :rank] = torch.randn(rank, k, generator=gen)
        b[i, :, :rank] = torch.randn(n, rank, generator=gen)
    x = torch.randn(t, k, generator=gen)
    slots = torch.tensor([(-1, 0, 1)[i % 3] for i in range(t)], dtype=torch.int32)
    scales = torch.tensor([0.5 + i for i in range(s)])
    return x, a, b, slots, scales


def test_the_reference_matches_one_product_per_row():
    x, a, b, slots, scales = _case()
    y = lora_shrink_ref(x, a, slots)
    out = torch.zeros(x.shape[0], b.shape[1])
    lora_expand_ref(y, b, slots, scales, out)
    for t, s in enumerate(slots.tolist()):
        want = torch.zeros(b.shape[1]) if s < 0 else scales[s] * (b[s] @ (a[s] @ x[t]))
        torch.testing.assert_close(out[t], want, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not cpu_lora.available(), reason="the CPU kernels need gcc")
@pytest.mark.parametrize("t", [1, 5, 40])
def test_the_c_kernels_match_the_reference(t):
    x, a, b, slots, scales = _case(t=t, k=200, n=300)
    y = cpu_lora.lora_shrink(x, a, slots)
    torch.testing.assert_close(y, lora_shrink_ref(x, a, slots), rtol=1e-5, atol=1e-5)
    wide = torch.randn(t, 300 + 17)
    out, ref = wide.clone(), wide.clone()
    cpu_lora.lora_expand(y, b, slots, scales, out[:, 17:])  # a column slice, as q/k/v's
    lora_expand_ref(y, b, slots, scales, ref[:, 17:])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(out[slots < 0], wide[slots < 0])  # base rows untouched


@pytest.mark.skipif(not cpu_lora.available(), reason="the CPU kernels need gcc")
@pytest.mark.parametrize(
    ("k", "n", "ranks"),
    [(203, 61, (8, 16)), (64, 24, (8, 8)), (50, 13, (3, 12)), (7, 5, (2, 1)), (576, 1536, (16, 16))],
)
def test_the_c_kernels_match_the_reference_at_every_tail(k, n, ranks):
    """Inputs and outputs past the last whole group of eight, ranks that are not a
    multiple of eight, and the unrolled ranks 8 and 16."""
    x, a, b, slots, scales = _case(t=9, k=k, n=n, ranks=ranks, seed=k)
    y = cpu_lora.lora_shrink(x, a, slots)
    torch.testing.assert_close(y, lora_shrink_ref(x, a, slots), rtol=1e-5, atol=1e-5)
    wide = torch.randn(9, n + 3)
    out, ref = wide.clone(), wide.clone()
    cpu_lora.lora_expand(y, b, slots, scales, out[:, 3:])
    lora_expand_ref(y, b, slots, scales, ref[:, 3:])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(out[slots < 0], wide[slots < 0])


def _group_case(n: int, k: int, widths: list[int], ranks=(8, 16), t: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    s, r = len(ranks), max(ranks)
    a, bs = torch.zeros(s, n * r, k), [torch.zeros(s, w, r) for w in widths]
    for i, rank in enumerate(ranks):
        for j in range(n):
            a[i, j * r : j * r + rank] = torch.randn(rank, k, generator=gen)
            bs[j][i, :, :rank] = torch.randn(widths[j], rank, generator=gen)
    x = torch.randn(t, k, generator=gen)
    slots = torch.tensor([(-1, 0, 1)[i % 3] for i in range(t)], dtype=torch.int32)
    return x, a, bs, slots, torch.tensor([0.5 + i for i in range(s)]), r


@pytest.mark.skipif(not cpu_lora.available(), reason="the CPU kernels need gcc")
@pytest.mark.parametrize(("k", "widths"), [(576, [576, 192, 192]), (203, [61, 8, 13]), (1536, [576])])
def test_the_group_kernel_matches_the_reference(k, widths):
    """One shrink for the group, each projection's expand into its columns of one buffer."""
    x, a, bs, slots, scales, r = _group_case(len(widths), k, widths, seed=k)
    wide = torch.randn(x.shape[0], sum(widths) + 5)
    out, ref = wide.clone(), wide.clone()
    starts = [5 + sum(widths[:i]) for i in range(len(widths))]
    cpu_lora.lora_group(x, a, bs, slots, scales, [out[:, s0:] for s0 in starts])
    y = lora_shrink_ref(x, a, slots)
    for i, (b, s0) in enumerate(zip(bs, starts, strict=True)):
        lora_expand_ref(y[:, i * r : (i + 1) * r], b, slots, scales, ref[:, s0 : s0 + widths[i]])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
    assert torch.equal(out[slots < 0], wide[slots < 0])


@pytest.mark.skipif(not cpu_lora.available(), reason="the CPU kernels need gcc")
@pytest.mark.parametrize(("k", "inter"), [(576, 1536), (40, 21)])
def test_the_swiglu_kernel_matches_the_reference(k, inter):
    """Gate and up interleaved 8 by 8 (the SwiGLU panels' product), their adapters added,
    then silu(gate) * up for every row."""
    x, a, bs, slots, scales, r = _group_case(2, k, [inter, inter], seed=k)
    a = a * 0.05  # adapter products of the base product's size, not hundreds of times it
    padded = -(-inter // 8) * 8
    gate, up = torch.randn(x.shape[0], padded), torch.randn(x.shape[0], padded)
    raw = torch.stack([gate.view(-1, padded // 8, 8), up.view(-1, padded // 8, 8)], dim=2)
    out = cpu_lora.lora_swiglu(x, a, bs, slots, scales, raw.reshape(x.shape[0], -1).contiguous())
    y = lora_shrink_ref(x, a, slots)
    lora_expand_ref(y[:, :r], bs[0], slots, scales, gate[:, :inter])
    lora_expand_ref(y[:, r:], bs[1], slots, scales, up[:, :inter])
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not cpu_lora.available(), reason="the CPU kernels need gcc")
def test_the_c_kernels_refuse_a_slot_out_of_range():
    x, a, _b, slots, _ = _case()
    slots[3] = 2
    with pytest.raises(ValueError, match="out of range"):
        cpu_lora.lora_shrink(x, a, slots)


def test_a_row_does_not_depend_on_the_rows_beside_it():
    assert cpu_lora.available(), "the CPU kernels did not build (the project needs gcc)"
    x, a, b, slots, scales = _case(t=30)
    alone = cpu_lora.lora_shrink(x[7:8], a, slots[7:8])
    assert torch.equal(cpu_lora.lora_shrink(x, a, slots)[7:8], alone)


def test_the_triton_kernels_match_the_reference():
    requires_backend()
    triton_lora = pytest.importorskip("chatsite_kernels.triton.lora")
    x, a, b, slots, scales = (v.to(DEVICE) for v in _case(t=7, k=96, n=80))
    y = triton_lora.lora_shrink(x, a, slots)
    torch.testing.assert_close(y, lora_shrink_ref(x, a, slots), rtol=1e-4, atol=1e-4)
    wide = torch.randn(7, 80 + 16, device=DEVICE)
    out, ref = wide.clone(), wide.clone()
    triton_lora.lora_expand(y, b, slots, scales, out[:, 16:])
    lora_expand_ref(y, b, slots, scales, ref[:, 16:])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
