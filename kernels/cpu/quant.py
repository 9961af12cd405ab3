"""Block-quantized weights for the CPU kernels: integer quants with per-group scales
(``QuantRows``), repacked into panels of 16 output features (``kernels/cpu/quant_linear.c``
describes the layout), and fp32 activations multiplied by them with the weights
de-quantized in registers.

Three formats, which GGUF's Q8_0, Q4_0, Q4_1, Q4_K and Q6_K blocks map onto (the
GGUF reader parses its blocks into ``QuantRows``):

- ``q8``  (Q8_0): int8 quants, one fp32 scale per 32 inputs;
- ``q8s`` (Q6_K): int8 quants (q - 32), one fp32 scale (d x sub-scale) per 16 inputs;
- ``q4``  (Q4_0, Q4_1, Q4_K): 4-bit quants, fp32 scale and offset per 32 inputs
  (Q4_0's offset is -8 d, Q4_K's is -dmin x sub-min).

Every de-quantized value ``scale * q + offset`` is bit-identical to gguf-py's numpy
de-quantization, which transformers' GGUF loader uses (the C file says why). The
packed tensor is the only copy of a weight the engine keeps.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from chatsite_kernels.cpu import build as cpu_build

PANEL = 16
FORMATS = {"q8": 0, "q8s": 1, "q4": 2}
GROUP = {"q8": 32, "q8s": 16, "q4": 32}
# Bytes of one group of one panel: scales (+ offsets) then quants.
GROUP_BYTES = {"q8": 64 + 32 * 16, "q8s": 64 + 16 * 16, "q4": 128 + 32 * 8}

_SYMBOL = "quant_linear_f32"
_ROWS_SYMBOL = "quant_rows_f32"
_ROW_INDEPENDENT_SYMBOL = "quant_linear_row_independent_max"


@dataclass
class QuantRows:
    """A weight ``[N, K]`` as integer quants with per-group scales (and offsets):
    ``w[n, k] = scale[n, k // G] * q[n, k] + offset[n, k // G]``. The parsed form,
    before packing (rows can still be permuted or concatenated)."""

    fmt: str
    q: torch.Tensor  # int8 [N, K] (0..15 for q4)
    scale: torch.Tensor  # fp32 [N, K / G]
    offset: torch.Tensor | None  # fp32 [N, K / G] for q4

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def take_rows(self, index: torch.Tensor | slice) -> QuantRows:
        return QuantRows(
            self.fmt, self.q[index], self.scale[index], None if self.offset is None else self.offset[index]
        )

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        g = GROUP[self.fmt]
        # Per group, broadcast rather than repeated: the same products and sums, bit for bit.
        w = self.q.view(n, k // g, g).float().mul_(self.scale.unsqueeze(-1))
        if self.offset is not None:
            w.add_(self.offset.unsqueeze(-1))
        return w.view(n, k)


def cat_rows(parts: list[QuantRows]) -> QuantRows:
    if len({p.fmt for p in parts}) != 1 or len({p.shape[1] for p in parts}) != 1:
        raise ValueError("only weights of one format and inner size concatenate")
    offsets = [p.offset for p in parts]
    return QuantRows(
        parts[0].fmt,
        torch.cat([p.q for p in parts]),
        torch.cat([p.scale for p in parts]),
        None if offsets[0] is None else torch.cat(offsets),  # type: ignore[arg-type]
    )


def interleave_gate_up(gate: QuantRows, up: QuantRows) -> QuantRows:
    """Rows ordered 8 gate, 8 up, 8 gate, ...: each panel of 16 is one fused SwiGLU
    panel (``linear(..., silu_pairs=True)``). Needs N a multiple of 8."""
    n, k = gate.shape
    if gate.shape != up.shape or n % 8:
        raise ValueError(f"gate {gate.shape} / up {up.shape}: need equal shapes, N a multiple of 8")
    both = cat_rows([gate, up])
    order = torch.arange(2 * n).view(2, n // 8, 8).transpose(0, 1).reshape(-1)
    return both.take_rows(order)


# ---- QuantRows -> panels ----


@dataclass
class PackedQuant:
    """A weight ``[out_features, in_features]`` in panels: ``data`` is uint8
    ``[ceil(N / 16), K / G, GROUP_BYTES[fmt]]``."""

    fmt: str
    data: torch.Tensor
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight ``[N, K]`` (tests, and the fallback without the C kernel)."""
        return unpack(self).dequantize()


def pack(rows: QuantRows) -> PackedQuant:
    n, k = rows.shape
    g = GROUP[rows.fmt]
    if k % g:
        raise ValueError(f"inner size {k} is not a multiple of {g}")
    pad = -n % PANEL
    panels, groups = (n + pad) // PANEL, k // g

    def panel_major(t: torch.Tensor) -> torch.Tensor:  # [N, ...] -> padded [P, 16, ...]
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        return t.view(panels, PANEL, *t.shape[1:])

    scale = panel_major(rows.scale).permute(0, 2, 1).contiguous().view(torch.uint8)  # [P, groups, 64]
    parts = [scale]
    if rows.fmt == "q4":
        if rows.offset is None:
            raise ValueError("q4 rows need offsets")
        parts.append(panel_major(rows.offset).permute(0, 2, 1).contiguous().view(torch.uint8))
    q = panel_major(rows.q).view(panels, PANEL, groups, g).permute(0, 2, 3, 1)  # [P, groups, G, 16]
    if rows.fmt == "q4":
        q = q.to(torch.uint8)
        q = q[..., :8] | (q[..., 8:] << 4)
    parts.append(q.contiguous().view(torch.uint8).reshape(panels, groups, -1))
    data = torch.cat(parts, dim=2).contiguous()
    assert data.shape[2] == GROUP_BYTES[rows.fmt]
    return PackedQuant(rows.fmt, data, n, k)


def unpack(packed: PackedQuant) -> QuantRows:
    fmt, g, n, k = packed.fmt, GROUP[packed.fmt], packed.out_features, packed.in_features
    data = packed.data
    panels, groups = data.shape[0], k // g

    def rows_major(t: torch.Tensor) -> torch.Tensor:  # [P, groups, 16] -> [N, groups]
        return t.permute(0, 2, 1).reshape(panels * PANEL, groups)[:n]

    scale = rows_major(data[:, :, :64].contiguous().view(torch.float32))
    offset, q_start = None, 64
    if fmt == "q4":
        offset, q_start = rows_major(data[:, :, 64:128].contiguous().view(torch.float32)), 128
    qb = data[:, :, q_start:]
    if fmt == "q4":
        qb = qb.reshape(panels, groups, g, 8)
        q = torch.cat([qb & 0x0F, qb >> 4], dim=-1).to(torch.int8)
    else:
        q = qb.reshape(panels, groups, g, PANEL).view(torch.int8)
    q = q.permute(0, 3, 1, 2).reshape(panels * PANEL, k)[:n]
    return QuantRows(fmt, q.contiguous(), scale.contiguous(), None if offset is None else offset.contiguous())


# ---- the C kernel ----


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    fn = getattr(lib, _SYMBOL)
    fn.argtypes = [ptr, i64, ptr, i32, ptr, ptr, i64, i64, i64, i64, i32, i32]
    fn.restype = i32
    rows = getattr(lib, _ROWS_SYMBOL)
    rows.argtypes = [ptr, i32, i64, i64, ptr, i64, ptr]
    rows.restype = i32
    getattr(lib, _ROW_INDEPENDENT_SYMBOL).restype = i64


def available() -> bool:
    return cpu_build.load_library("quant_linear", _declare) is not None


def row_independent_max() -> int:
    """Up to this many rows, ``linear`` gives each row the bits it gets alone: a row's
    result does not depend on the batch beside it (with AVX-512, any number of rows)."""
    lib = cpu_build.require("quant_linear", _declare)
    return int(getattr(lib, _ROW_INDEPENDENT_SYMBOL)())


def check_packed(packed: PackedQuant, name: str = "packed") -> None:
    """``packed`` is what ``pack()`` makes for its declared shape: the kernels read
    ``data`` as exactly that many panels of scales and quants."""
    if not isinstance(packed, PackedQuant) or packed.fmt not in FORMATS:
        raise ValueError(f"{name}: expected a PackedQuant from chatsite_kernels.cpu.quant.pack()")
    g = GROUP[packed.fmt]
    n, k = packed.out_features, packed.in_features
    if n < 0 or k < g or k % g:
        raise ValueError(f"{name}: [{n}, {k}] is not a {packed.fmt} weight shape (K a multiple of {g})")
    expected = (-(-n // PANEL), k // g, GROUP_BYTES[packed.fmt])
    data = packed.data
    if (
        not isinstance(data, torch.Tensor)
        or data.dtype != torch.uint8
        or data.device.type != "cpu"
        or tuple(data.shape) != expected
        or not data.is_contiguous()
    ):
        got = f"{data.dtype} {tuple(data.shape)}" if isinstance(data, torch.Tensor) else type(data).__name__
        raise ValueError(
            f"{name}: data {got} is not the contiguous uint8 {expected} panels of a {packed.fmt} [{n}, {k}] weight"
        )


def linear(
    x: torch.Tensor, packed: PackedQuant, bias: torch.Tensor | None = None, silu_pairs: bool = False
) -> torch.Tensor:
    """``F.linear(x, W, bias)`` with ``W = packed.dequantize()``; with ``silu_pairs``
    (rows from ``interleave_gate_up``) ``silu(x Wg^T) * (x Wu^T)`` instead."""
    lib = cpu_build.require("quant_linear", _declare)
    check_packed(packed)
    n, k = packed.out_features, packed.in_features
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x: expected fp32 CPU [..., {k}], got {x.dtype} {tuple(x.shape)} on {x.device}")
    if silu_pairs and (n % PANEL or bias is not None):
        raise ValueError("silu_pairs: needs a multiple of 16 interleaved rows and no bias")
    if bias is not None:
        if bias.dtype != torch.float32 or bias.device.type != "cpu" or tuple(bias.shape) != (n,):
            raise ValueError(f"bias: expected fp32 CPU [{n}], got {bias.dtype} {tuple(bias.shape)}")
        bias = bias.contiguous()  # held here for the call
    rows = cpu_build.as_rows(x, k)
    out_cols = n // 2 if silu_pairs else n
    out = torch.empty(rows.shape[0], out_cols, dtype=torch.float32)
    rc = getattr(lib, _SYMBOL)(
        rows.data_ptr(),
        rows.stride(0),
        packed.data.data_ptr(),
        FORMATS[packed.fmt],
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        rows.shape[0],
        n,
        k,
        int(silu_pairs),
        torch.get_num_threads(),
    )
    cpu_build.check(rc, _SYMBOL)
    return out.view(*x.shape[:-1], out_cols)


def embedding(ids: torch.Tensor, packed: PackedQuant) -> torch.Tensor:
    """The de-quantized rows ``ids`` of ``packed``: ``[*ids.shape, K]`` fp32."""
    check_packed(packed)
    if ids.dtype not in (torch.int32, torch.int64) or ids.device.type != "cpu":
        raise ValueError(f"ids: expected an integer CPU tensor, got {ids.dtype} on {ids.device}")
    flat = ids.reshape(-1).to(torch.int64).contiguous()  # held here for the call
    k = packed.in_features
    out = torch.empty(flat.numel(), k, dtype=torch.float32)
    lib = cpu_build.load_library("quant_linear", _declare)
    if lib is None:
        if flat.numel() and (flat.min() < 0 or flat.max() >= packed.out_features):
            raise ValueError(f"ids: out of range for {packed.out_features} rows")
        rows = unpack(packed)
        return rows.take_rows(flat).dequantize().view(*ids.shape, k)
    rc = getattr(lib, _ROWS_SYMBOL)(
        packed.data.data_ptr(), FORMATS[packed.fmt], packed.out_features, k, flat.data_ptr(), flat.numel(),
        out.data_ptr(),
    )  # fmt: skip
    cpu_build.check(rc, _ROWS_SYMBOL, bad_index=f"ids: out of range for {packed.out_features} rows")
    return out.view(*ids.shape, k)
