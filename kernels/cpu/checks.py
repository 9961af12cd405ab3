"""Argument checks for the C kernels' Python wrappers.

The C side trusts its pointers and sizes, so every wrapper checks, before the call,
each tensor's dtype, device, rank, inner contiguity and its shape against the others,
and raises ``ValueError`` naming the argument. (A wrong call must be a Python error,
never a read or write out of bounds.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


def tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    dim: int | None = None,
    min_dim: int = 0,
    inner_contiguous: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """``t`` as a CPU tensor of one of ``dtypes`` with the given rank and layout."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dtype not in dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be {wanted}, got {str(t.dtype).removeprefix('torch.')}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if inner_contiguous and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit stride in its last dimension, got {t.stride()}")
    return t


def size(name: str, actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"{name}: {what} is {actual}, expected {expected}")


def at_least(name: str, actual: int, minimum: int, what: str) -> None:
    if actual < minimum:
        raise ValueError(f"{name}: {what} is {actual}, expected at least {minimum}")
