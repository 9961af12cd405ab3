"""The gated delta rule's kernels (C on the CPU, Triton) against the PyTorch reference
(``chatsite_kernels.gated_delta_reference``), on packed steps mixing decode rows and
prefill spans, states continuing from their slots or starting from zero; and the
reference's chunked form against its token-by-token form."""

from __future__ import annotations

import pytest
import torch

from chatsite_kernels import gated_delta_reference as reference
from chatsite_kernels.cpu import gated_delta as cpu_gated_delta


def _step(lengths: list[int], heads: int = 4, dk: int = 16, dv: int = 24, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q = reference.l2_normalize(torch.randn(tokens, heads, dk, generator=gen)) * dk**-0.5
    k = reference.l2_normalize(torch.randn(tokens, heads, dk, generator=gen))
    num_slots = len(lengths) + 3
    pool = torch.randn(num_slots, heads, dk, dv, generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[: len(lengths)]
    has_initial = torch.tensor([i % 3 != 1 for i in range(len(lengths))])
    pool[slots[~has_initial]] = float("nan")  # a recycled slot's contents must not be read
    return {
        "q": q,
        "k": k,
        "v": torch.randn(tokens, heads, dv, generator=gen),
        "g": -torch.rand(tokens, heads, generator=gen) * 2,
        "beta": torch.rand(tokens, heads, generator=gen),
        "ssm_pool": pool,
        "slots": slots,
        "has_initial": has_initial,
        "query_start_loc": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
    }


def _reference(step: dict) -> tuple[torch.Tensor, torch.Tensor]:
    pool = step["ssm_pool"].clone()
    out = reference.gated_delta_varlen(**{**step, "ssm_pool": pool})
    return out, pool


STEPS = {
    "decode": [1, 1, 1, 1, 1],
    "prefill": [130],
    "mixed": [1, 70, 3, 1, 129],
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_c_kernel_matches_reference(name: str) -> None:
    assert cpu_gated_delta.available(), "the C kernel did not build"
    step = _step(STEPS[name])
    expected, expected_pool = _reference(step)
    pool = step["ssm_pool"].clone()
    out = cpu_gated_delta.gated_delta_varlen(**{**step, "ssm_pool": pool})
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(pool, expected_pool, atol=2e-5, rtol=1e-4)


def test_c_kernel_refuses_bad_slots() -> None:
    step = _step([2, 3])
    with pytest.raises(ValueError, match="outside the state pool"):
        cpu_gated_delta.gated_delta_varlen(**{**step, "slots": torch.tensor([0, 99])})
    with pytest.raises(ValueError, match="share a state slot"):
        cpu_gated_delta.gated_delta_varlen(**{**step, "slots": torch.tensor([1, 1])})


@pytest.mark.parametrize("length", [1, 63, 64, 65, 200])
def test_chunked_form_equals_token_by_token(length: int) -> None:
    step = _step([length], seed=length)
    state = step["ssm_pool"][0]
    out, final = reference.gated_delta_chunked(
        step["q"], step["k"], step["v"], step["g"], step["beta"], state, chunk_size=64
    )
    running = state[None].clone()
    rows = [
        reference.gated_delta_recurrent(
            step["q"][t : t + 1],
            step["k"][t : t + 1],
            step["v"][t : t + 1],
            step["g"][t : t + 1],
            step["beta"][t : t + 1],
            running,
        )
        for t in range(length)
    ]
    torch.testing.assert_close(out, torch.cat(rows), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(final, running[0], atol=2e-5, rtol=1e-4)


def test_conv_continues_across_steps() -> None:
    """The causal convolution over a span equals the same span fed in two steps."""
    gen = torch.Generator().manual_seed(3)
    channels, width = 10, 4
    x = torch.randn(9, channels, generator=gen)
    weight = torch.randn(channels, width, generator=gen)
    one = torch.zeros(2, channels, width - 1)
    two = torch.zeros(2, channels, width - 1)
    slots, fresh, cont = torch.tensor([1]), torch.tensor([False]), torch.tensor([True])
    whole = reference.causal_conv1d_varlen(x, weight, one, slots, fresh, torch.tensor([0, 9]))
    first = reference.causal_conv1d_varlen(x[:2], weight, two, slots, fresh, torch.tensor([0, 2]))
    rest = [
        reference.causal_conv1d_varlen(x[t : t + 1], weight, two, slots, cont, torch.tensor([0, 1]))
        for t in range(2, 9)
    ]
    torch.testing.assert_close(torch.cat([first, *rest]), whole)
    torch.testing.assert_close(two, one)
    assert torch.equal(one[0], torch.zeros(channels, width - 1))  # the other slot is untouched


@pytest.mark.parametrize("name", sorted(STEPS))
def test_triton_kernel_matches_reference(name: str) -> None:
    from tests.kernels.cases import DEVICE, requires_backend

    requires_backend()
    triton_gated_delta = pytest.importorskip("chatsite_kernels.triton.gated_delta")
    step = _step(STEPS[name])
    expected, expected_pool = _reference(step)
    on_device = {key: t.to(DEVICE) for key, t in step.items()}
    out = triton_gated_delta.gated_delta_varlen(**on_device)
    torch.testing.assert_close(out.cpu(), expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(on_device["ssm_pool"].cpu(), expected_pool, atol=2e-5, rtol=1e-4)
