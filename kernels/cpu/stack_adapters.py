"""LoRA adapters inside the one-call decode step (``kernels/cpu/decode_stack.c``, with
``lora.c``'s shrink and expand linked in): the resident adapters' stacked A and B of
every layer described once as C structs, and each step's row slots and scales.

The layout is the adapters' unified one (S-LoRA): per layer and projection group
(q/k/v, o, gate/up, down) A ``[S, G * R, K]`` (the group's A matrices one under the
other) and per projection B ``[S, N, R]``; slot ``s`` of every stack is one adapter.
The stacks are written in place when adapters come and go, so the description made
once stays valid for the stacks' lifetime.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from chatsite_kernels.cpu import checks as cpu_checks

GROUPS = ("qkv", "o", "gate_up", "down")


class _Group(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p * 3)]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Group) for name in GROUPS]


class _Lora(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_void_p),
        ("row_slots", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("num_slots", ctypes.c_int64),
        ("rank", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class AdapterGroup:
    """One projection group's stacks: ``a`` ``[S, len(b) * R, K]``, ``b`` ``[S, N_i, R]`` each."""

    a: torch.Tensor
    b: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class AdapterStep:
    """One step's adapters, as the C call reads them; holds the tensors it points to."""

    struct: _Lora
    row_slots: torch.Tensor
    scales: torch.Tensor
    rank: int


def _f32(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    cpu_checks.tensor(name, t, dim=len(shape), contiguous=True)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")


class StackAdapters:
    """Every layer's adapter stacks for a stack of ``widths`` (each group's input size and
    its projections' output sizes), checked once: the C side trusts every pointer."""

    def __init__(
        self,
        layers: list[dict[str, AdapterGroup]],
        widths: dict[str, tuple[int, tuple[int, ...]]],
        num_slots: int,
        rank: int,
    ) -> None:
        cpu_checks.at_least("num_slots", num_slots, 1, "the number of adapter slots")
        cpu_checks.at_least("rank", rank, 1, "the adapters' rank")
        for i, layer in enumerate(layers):
            for group in GROUPS:
                stack, (k, outs) = layer[group], widths[group]
                if len(stack.b) != len(outs):
                    raise ValueError(f"layer {i} {group}: {len(stack.b)} B stacks, expected {len(outs)}")
                _f32(f"layer {i} {group} A", stack.a, (num_slots, len(outs) * rank, k))
                for j, (b, n) in enumerate(zip(stack.b, outs, strict=True)):
                    _f32(f"layer {i} {group} B{j}", b, (num_slots, n, rank))
        self.layers, self.num_slots, self.rank = layers, num_slots, rank
        self._layers = (_Layer * len(layers))(*(self._layer(layer) for layer in layers))

    @staticmethod
    def _layer(layer: dict[str, AdapterGroup]) -> _Layer:
        def group(stack: AdapterGroup) -> _Group:
            pointers = [b.data_ptr() for b in stack.b] + [None] * (3 - len(stack.b))
            return _Group(stack.a.data_ptr(), (ctypes.c_void_p * 3)(*pointers))

        return _Layer(*(group(layer[name]) for name in GROUPS))

    def step(self, row_slots: torch.Tensor, scales: torch.Tensor, rows: int) -> AdapterStep:
        """``row_slots`` ``[rows]`` int32 (each row's slot, -1: the base model), ``scales`` ``[S]``."""
        cpu_checks.tensor("row_slots", row_slots, dtypes=(torch.int32,), dim=1, contiguous=True)
        cpu_checks.size("row_slots", row_slots.shape[0], rows, "the number of rows")
        _f32("scales", scales, (self.num_slots,))
        bad = (row_slots < -1) | (row_slots >= self.num_slots)
        if bool(bad.any()):
            raise IndexError(f"row_slots: a slot is outside -1..{self.num_slots - 1}")
        struct = _Lora(
            ctypes.addressof(self._layers),
            row_slots.data_ptr(),
            scales.data_ptr(),
            self.num_slots,
            self.rank,
        )
        return AdapterStep(struct, row_slots, scales, self.rank)
