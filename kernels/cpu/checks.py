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


# The largest value a C ``int`` (``ctypes.c_int``, an ``int32_t`` tensor) holds: a
# larger size, count or index would wrap on the way in (2**32 + 1 arrives as 1, a
# valid but wrong block id), so each is checked before it is narrowed.
INT32_MAX = 2**31 - 1


def int32(name: str, value: int, *, minimum: int = 0) -> int:
    """``value`` unchanged, once it is known to fit a C ``int`` (and be ``>= minimum``)."""
    value = int(value)
    if not minimum <= value <= INT32_MAX:
        raise ValueError(
            f"{name} is {value}, outside the 32-bit range [{minimum}, 2**31 - 1] the kernel takes"
        )
    return value


def int32_values(name: str, t: torch.Tensor, *, minimum: int = 0) -> torch.Tensor:
    """An index tensor as ``int32`` (``t`` itself when it already is), its values checked
    against ``[minimum, 2**31 - 1]`` first when narrowing would change them."""
    if t.dtype == torch.int32:
        return t
    if t.numel():
        low, high = (int(v) for v in t.aminmax())
        if low < minimum or high > INT32_MAX:
            bad = low if low < minimum else high
            raise ValueError(
                f"{name} holds {bad}, outside the 32-bit range [{minimum}, 2**31 - 1] the kernel takes"
            )
    return t.to(torch.int32)
