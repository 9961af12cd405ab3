"""A Llama-style decoder stack's decode step on CPU in one C call
(``kernels/cpu/decode_stack.c``, linked with the quantized and fp32 GEMMs, the layer
ops and paged decode attention). The KV pool is fp32 or float16; everything else is fp32.

The model describes its layers once (``StackLayer``: the norms and four products, each
quantized panels from ``chatsite_kernels.cpu.quant`` or fp32 panels from ``chatsite_kernels.cpu.linear``);
``DecodeStack`` holds that description as C structs and runs a decode step over it.
The arithmetic is the per-op path's, call for call, so the output is bit-identical;
what goes away is the Python glue between the calls (see the C file).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import checks as cpu_checks
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.stack_adapters import AdapterGroup, AdapterStep, StackAdapters

_SYMBOL = "decode_stack_f32"
FMT_F32 = -1  # fp32 panels (cpu_linear.pack_weight / pack_gate_up)
POOL_DTYPES = (torch.float32, torch.float16)  # the KV pool's; the C side takes either


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
            for name in ("block", "plane", "layer", "pos", "head", "num_blocks", "block_size", "kv16")
        ),
    ]


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = getattr(lib, _SYMBOL)
    fn.argtypes = [
        *(ptr, i64, ptr, ptr),  # layers, num_layers, shape, final_norm
        *(ptr, i64, ptr, ptr),  # hidden, rows, cos_sin, slots
        *(ptr, ptr, i64, i64, ptr),  # pool, block_tables, row stride, width, context_lens
        *(ptr, ptr, ctypes.c_int),  # adapters (or NULL), scratch, threads
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


def _f32(name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
    """``t`` as a contiguous fp32 CPU tensor of exactly ``shape`` (the C side reads that many floats)."""
    t = cpu_checks.tensor(name, t, dim=len(shape), contiguous=True)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return t


def _check_shape(s: StackShape) -> None:
    for name in ("hidden", "q_heads", "kv_heads", "head_dim", "intermediate"):
        cpu_checks.at_least(f"shape.{name}", getattr(s, name), 1, "the size")
    # The layer ops and attention take the head counts and size as 32-bit ints.
    cpu_checks.int32("shape.q_heads + 2 * kv_heads", s.q_heads + 2 * s.kv_heads)
    cpu_checks.int32("shape.head_dim", s.head_dim, minimum=2)
    if s.q_heads % s.kv_heads:
        raise ValueError(f"shape.kv_heads: {s.kv_heads} KV heads do not divide {s.q_heads} query heads")
    if s.head_dim % 2:
        raise ValueError(f"shape.head_dim: {s.head_dim} is odd (rotary embedding rotates halves)")


def _check_linear(name: str, w: StackLinear, out_features: int, in_features: int, swiglu: bool) -> None:
    """``w`` holds exactly the panels (and bias) of an ``[out_features, in_features]``
    product; ``swiglu``: gate and up rows interleaved, ``out_features`` of each."""
    if isinstance(w.weight, cpu_quant.PackedQuant):
        cpu_quant.check_packed(w.weight, f"{name} quantized panels")
        rows = 2 * out_features if swiglu else out_features
        actual = (w.weight.out_features, w.weight.in_features)
        if actual != (rows, in_features):
            raise ValueError(
                f"{name} quantized panels: a {list(actual)} weight, expected [{rows}, {in_features}]"
            )
        if swiglu and rows % cpu_quant.PANEL:
            raise ValueError(f"{name} quantized panels: fused SwiGLU needs a multiple of 16 rows, got {rows}")
    elif swiglu:  # pack_gate_up: 8 gate then 8 up features per panel
        _f32(f"{name} fp32 panels", w.weight, (-(-out_features // 8), in_features, 16))
    else:  # pack_weight: 16 features per panel
        _f32(f"{name} fp32 panels", w.weight, (-(-out_features // 16), in_features, 16))
    if w.bias is not None:
        if swiglu:
            raise ValueError(f"{name}: the fused SwiGLU product takes no bias")
        _f32(f"{name} bias", w.bias, (out_features,))


def _check_layer(i: int, layer: StackLayer, s: StackShape) -> None:
    """Every buffer of ``layer`` against the shape: the C side trusts each pointer to
    hold the floats or panels that shape implies."""
    for name in ("input_norm", "post_norm"):
        _f32(f"layer {i} {name}", getattr(layer, name), (s.hidden,))
    qkv, attn = (s.q_heads + 2 * s.kv_heads) * s.head_dim, s.q_heads * s.head_dim
    _check_linear(f"layer {i} qkv", layer.qkv, qkv, s.hidden, swiglu=False)
    _check_linear(f"layer {i} o", layer.o, s.hidden, attn, swiglu=False)
    _check_linear(f"layer {i} gate_up", layer.gate_up, s.intermediate, s.hidden, swiglu=True)
    _check_linear(f"layer {i} down", layer.down, s.hidden, s.intermediate, swiglu=False)


class DecodeStack:
    """The C description of a model's layers, kept alive with the tensors it points to.
    Every buffer is checked against ``shape`` here, and every input at each call."""

    def __init__(self, layers: list[StackLayer], final_norm: torch.Tensor, shape: StackShape) -> None:
        _check_shape(shape)
        for i, layer in enumerate(layers):
            _check_layer(i, layer, shape)
        _f32("final_norm", final_norm, (shape.hidden,))
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

    def adapters(self, layers: list[dict[str, AdapterGroup]], num_slots: int, rank: int) -> StackAdapters:
        """The LoRA stacks of every layer (``stack_adapters``), checked against this stack's shape."""
        s = self.shape
        q, kv, attn = s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.q_heads * s.head_dim
        widths = {
            "qkv": (s.hidden, (q, kv, kv)),
            "o": (attn, (s.hidden,)),
            "gate_up": (s.hidden, (s.intermediate, s.intermediate)),
            "down": (s.intermediate, (s.hidden,)),
        }
        if len(layers) != len(self.layers):
            raise ValueError(f"adapters: {len(layers)} layers of stacks for a stack of {len(self.layers)}")
        return StackAdapters(layers, widths, num_slots, rank)

    def scratch_floats(self, rows: int, rank: int = 0) -> int:
        """What the C call needs; ``rank``: the adapters' (0: none), whose MLP runs gate
        and up apart, on rows padded to 8 features."""
        s = self.shape
        base = rows * (2 * s.hidden + (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim + s.intermediate)
        padded = -(-s.intermediate // 8) * 8
        return base + (rows * (3 * padded + 3 * rank) if rank else 0)

    def _pool(self, kv_cache: torch.Tensor) -> _Pool:
        """The pool ``[num_blocks, 2, num_layers, block_size, Hkv, D]`` (fp32 or float16)
        by its strides, in elements."""
        s, layers = self.shape, len(self.layers)
        cpu_checks.tensor("kv_cache", kv_cache, dtypes=POOL_DTYPES, dim=6, inner_contiguous=True)
        expected = (2, layers, kv_cache.shape[3], s.kv_heads, s.head_dim)
        if tuple(kv_cache.shape[1:]) != expected:
            raise ValueError(
                f"kv_cache: expected float32 or float16 CPU [blocks, 2, {layers}, block, {s.kv_heads},"
                f" {s.head_dim}], got {list(kv_cache.shape)}"
            )
        blocks = cpu_checks.int32("kv_cache: the number of blocks", kv_cache.shape[0])
        block_size = cpu_checks.int32("kv_cache: the block size", kv_cache.shape[3], minimum=1)
        st = kv_cache.stride()
        kv16 = int(kv_cache.dtype == torch.float16)
        return _Pool(kv_cache.data_ptr(), st[0], st[1], st[2], st[3], st[4], blocks, block_size, kv16)

    def __call__(
        self,
        hidden: torch.Tensor,
        cos_sin: torch.Tensor,
        slots: torch.Tensor,
        kv_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        adapters: AdapterStep | None = None,
    ) -> torch.Tensor:
        """One decode step: ``hidden`` ``[M, H]`` embeddings of each sequence's new token
        (overwritten), ``cos_sin`` ``[M, D]``, ``slots`` ``[M]`` (its K/V's cache slot),
        ``kv_cache`` the pool ``[num_blocks, 2, num_layers, block_size, Hkv, D]``
        (fp32 or float16),
        ``block_tables`` ``[M, W]`` and ``context_lens`` ``[M]``; ``adapters``: the rows'
        LoRA adapters (``StackAdapters.step``) or None. Returns the final norm's output
        ``[M, H]`` (in ``hidden``'s storage)."""
        s = self.shape
        cpu_checks.tensor("hidden", hidden, dim=2, contiguous=True)
        cpu_checks.at_least("hidden", hidden.shape[0], 1, "the number of rows")
        rows = cpu_checks.int32("hidden: the number of rows", hidden.shape[0])
        cpu_checks.size("hidden", hidden.shape[1], s.hidden, "the last dimension")
        _f32("cos_sin", cos_sin, (rows, s.head_dim))
        index = cpu_checks.INDEX_DTYPES
        cpu_checks.tensor("slots", slots, dtypes=index, dim=1)
        cpu_checks.tensor("block_tables", block_tables, dtypes=index, dim=2)
        cpu_checks.tensor("context_lens", context_lens, dtypes=index, dim=1)
        for name, t in (("slots", slots), ("block_tables", block_tables), ("context_lens", context_lens)):
            cpu_checks.size(name, t.shape[0], rows, "the number of rows (one per hidden row)")
        cpu_checks.int32("block_tables: the width", block_tables.shape[1])
        # Narrowed to what the C side reads, values checked first; held until the call returns.
        slots = slots.to(torch.int64).contiguous()
        tables = cpu_checks.int32_values("block_tables", block_tables)
        tables = tables if tables.stride(-1) == 1 else tables.contiguous()
        lens = cpu_checks.int32_values("context_lens", context_lens).contiguous()
        pool = self._pool(kv_cache)
        if adapters is not None:
            cpu_checks.size("adapters", adapters.row_slots.shape[0], rows, "the number of rows")
        rank = adapters.rank if adapters is not None else 0
        scratch = torch.empty(self.scratch_floats(rows, rank), dtype=torch.float32)
        lora = ctypes.byref(adapters.struct) if adapters is not None else None
        rc = cpu_build.require("decode_stack", _declare).decode_stack_f32(
            self._layers, len(self.layers), ctypes.byref(self._shape), self.final_norm.data_ptr(),
            hidden.data_ptr(), rows, cos_sin.data_ptr(), slots.data_ptr(),
            ctypes.byref(pool), tables.data_ptr(), tables.stride(0), tables.shape[1], lens.data_ptr(),
            lora, scratch.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        cpu_build.check(rc, _SYMBOL, "a slot, block id or context length is outside the KV cache")
        return hidden
