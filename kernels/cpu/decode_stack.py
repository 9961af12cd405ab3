"""A Llama-style decoder stack's decode step on CPU in one C call
(``kernels/cpu/decode_stack.c``, linked with the quantized and fp32 GEMMs, the layer
ops and paged decode attention).

The model describes its layers once (``StackLayer``: the norms and four products, each
quantized panels from ``kernels.cpu.quant`` or fp32 panels from ``kernels.cpu.linear``);
``DecodeStack`` holds that description as C structs and runs a decode step over it.
The arithmetic is the per-op path's, call for call, so the output is bit-identical;
what goes away is the Python glue between the calls (see the C file).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu import build as cpu_build
from kernels.cpu import checks as cpu_checks
from kernels.cpu import quant as cpu_quant

_SYMBOL = "decode_stack_f32"
FMT_F32 = -1  # fp32 panels (cpu_linear.pack_weight / pack_gate_up)


class _Linear(ctypes.Structure):
    _fields_ = [("weight", ctypes.c_void_p), ("fmt", ctypes.c_int64), ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        *((name, _Linear) for name in ("qkv", "o", "gate_up", "down")),
    ]


class _Shape(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("hidden", "q_heads", "kv_heads", "head_dim", "intermediate")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
    ]


class _Pool(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_void_p),
        *(
            (name, ctypes.c_int64)
            for name in ("block", "plane", "layer", "pos", "head", "num_blocks", "block_size")
        ),
    ]


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = getattr(lib, _SYMBOL)
    fn.argtypes = [
        *(ptr, i64, ptr, ptr),  # layers, num_layers, shape, final_norm
        *(ptr, i64, ptr, ptr),  # hidden, rows, cos_sin, slots
        *(ptr, ptr, i64, i64, ptr),  # pool, block_tables, row stride, width, context_lens
        *(ptr, ctypes.c_int),  # scratch, threads
    ]
    fn.restype = ctypes.c_int


def available() -> bool:
    return cpu_build.load_library("decode_stack", _declare) is not None


@dataclass(frozen=True)
class StackLinear:
    """One product: ``weight`` is a ``PackedQuant`` or fp32 panels (``FMT_F32``)."""

    weight: cpu_quant.PackedQuant | torch.Tensor
    bias: torch.Tensor | None = None

    @property
    def fmt(self) -> int:
        if isinstance(self.weight, cpu_quant.PackedQuant):
            return cpu_quant.FORMATS[self.weight.fmt]
        return FMT_F32

    @property
    def data(self) -> torch.Tensor:
        return self.weight.data if isinstance(self.weight, cpu_quant.PackedQuant) else self.weight


@dataclass(frozen=True)
class StackLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: StackLinear  # q, k, v rows in one product
    o: StackLinear
    gate_up: StackLinear  # fused SwiGLU (no bias)
    down: StackLinear


@dataclass(frozen=True)
class StackShape:
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float


def _contiguous_f32(name: str, t: torch.Tensor) -> None:
    cpu_checks.tensor(name, t, contiguous=True)
    if t.dtype != torch.float32:
        raise ValueError(f"{name}: expected float32, got {t.dtype}")


class DecodeStack:
    """The C description of a model's layers, kept alive with the tensors it points to."""

    def __init__(self, layers: list[StackLayer], final_norm: torch.Tensor, shape: StackShape) -> None:
        for i, layer in enumerate(layers):
            for name in ("input_norm", "post_norm"):
                _contiguous_f32(f"layer {i} {name}", getattr(layer, name))
            for name in ("qkv", "o", "gate_up", "down"):
                linear: StackLinear = getattr(layer, name)
                if not linear.data.is_contiguous() or linear.data.device.type != "cpu":
                    raise ValueError(f"layer {i} {name}: weight panels must be contiguous CPU tensors")
                if linear.bias is not None:
                    _contiguous_f32(f"layer {i} {name} bias", linear.bias)
            if layer.gate_up.bias is not None:
                raise ValueError(f"layer {i}: the fused SwiGLU product takes no bias")
        _contiguous_f32("final_norm", final_norm)
        self.layers, self.final_norm, self.shape = layers, final_norm, shape
        self._layers = (_Layer * len(layers))(*(self._layer(layer) for layer in layers))
        self._shape = _Shape(
            shape.hidden,
            shape.q_heads,
            shape.kv_heads,
            shape.head_dim,
            shape.intermediate,
            shape.eps,
            shape.scale,
        )

    @staticmethod
    def _layer(layer: StackLayer) -> _Layer:
        def linear(w: StackLinear) -> _Linear:
            return _Linear(w.data.data_ptr(), w.fmt, None if w.bias is None else w.bias.data_ptr())

        return _Layer(
            layer.input_norm.data_ptr(),
            layer.post_norm.data_ptr(),
            *(linear(getattr(layer, n)) for n in ("qkv", "o", "gate_up", "down")),
        )

    def scratch_floats(self, rows: int) -> int:
        s = self.shape
        return rows * (2 * s.hidden + (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim + s.intermediate)

    def __call__(
        self,
        hidden: torch.Tensor,
        cos_sin: torch.Tensor,
        slots: torch.Tensor,
        kv_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One decode step: ``hidden`` ``[M, H]`` embeddings of each sequence's new token
        (overwritten), ``cos_sin`` ``[M, D]``, ``slots`` ``[M]`` (its K/V's cache slot),
        ``kv_cache`` the pool ``[num_blocks, 2, num_layers, block_size, Hkv, D]``,
        ``block_tables`` ``[M, W]`` and ``context_lens`` ``[M]``. Returns the final norm's
        output ``[M, H]`` (in ``hidden``'s storage)."""
        s = self.shape
        rows = hidden.shape[0]
        _contiguous_f32("hidden", hidden)
        cpu_checks.size("hidden", hidden.shape[-1], s.hidden, "the last dimension")
        _contiguous_f32("cos_sin", cos_sin)
        if tuple(cos_sin.shape) != (rows, s.head_dim):
            raise ValueError(f"cos_sin: expected [{rows}, {s.head_dim}], got {tuple(cos_sin.shape)}")
        slots = slots.to(torch.int64).contiguous()
        tables = block_tables.to(torch.int32)
        tables = tables if tables.stride(-1) == 1 else tables.contiguous()
        lens = context_lens.to(torch.int32).contiguous()
        if slots.shape != (rows,) or lens.shape != (rows,) or tables.dim() != 2 or tables.shape[0] != rows:
            raise ValueError("slots, context_lens and block_tables must have one row per hidden row")
        pool_shape = (len(self.layers), kv_cache.shape[3], s.kv_heads, s.head_dim)
        if (
            kv_cache.dim() != 6
            or kv_cache.shape[1] != 2
            or (kv_cache.shape[2], *kv_cache.shape[3:]) != pool_shape
            or kv_cache.dtype != torch.float32
            or kv_cache.device.type != "cpu"
            or kv_cache.stride(-1) != 1
        ):
            raise ValueError(f"kv_cache: expected fp32 CPU [blocks, 2, {len(self.layers)}, block, Hkv, D]")
        st = kv_cache.stride()
        pool = _Pool(
            kv_cache.data_ptr(), st[0], st[1], st[2], st[3], st[4], kv_cache.shape[0], kv_cache.shape[3]
        )
        scratch = torch.empty(self.scratch_floats(rows), dtype=torch.float32)
        rc = cpu_build.require("decode_stack", _declare).decode_stack_f32(
            self._layers, len(self.layers), ctypes.byref(self._shape), self.final_norm.data_ptr(),
            hidden.data_ptr(), rows, cos_sin.data_ptr(), slots.data_ptr(),
            ctypes.byref(pool), tables.data_ptr(), tables.stride(0), tables.shape[1], lens.data_ptr(),
            scratch.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        cpu_build.check(rc, _SYMBOL, "a slot, block id or context length is outside the KV cache")
        return hidden
