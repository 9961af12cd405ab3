"""GGUF's block layouts (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) parsed into ``QuantRows``, the
integer quants and per-group scales the CPU kernels pack into panels
(``chatsite_kernels.cpu.quant``). The arithmetic is gguf-py's numpy de-quantization, stopped
before the multiply, so every weight the kernels de-quantize is bit-identical to it."""

from __future__ import annotations

import numpy as np
import torch

from chatsite_kernels.cpu.quant import GROUP, QuantRows

# GGUF type name -> (panel format, elements per GGUF block, bytes per GGUF block)
GGUF_TYPES = {
    "Q8_0": ("q8", 32, 34),
    "Q4_0": ("q4", 32, 18),
    "Q4_1": ("q4", 32, 20),
    "Q4_K": ("q4", 256, 144),
    "Q6_K": ("q8s", 256, 210),
}


def _f16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """Bytes ``[..., chunk]`` -> ``[..., 2 * chunk]``: low nibbles, then high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def parse_gguf_blocks(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantRows:
    """``raw``: uint8 ``[N, row_bytes]`` of a GGUF tensor of ``type_name``; ``shape``:
    ``(N, K)``. Raises ValueError if the bytes do not fit the shape and type."""
    if type_name not in GGUF_TYPES:
        raise ValueError(f"GGUF type {type_name} is not supported by the quantized kernels")
    fmt, block, block_bytes = GGUF_TYPES[type_name]
    n, k = shape
    if k % block or raw.shape != (n, k // block * block_bytes):
        raise ValueError(f"{type_name} data {raw.shape} does not fit a [{n}, {k}] weight")
    b = raw.reshape(n * (k // block), block_bytes)
    offset = None
    if type_name == "Q8_0":
        scale, q = _f16(b[:, :2]), b[:, 2:].view(np.int8)
    elif type_name in ("Q4_0", "Q4_1"):
        start = 2 if type_name == "Q4_0" else 4
        d = _f16(b[:, :2])
        q = _nibbles(b[:, start:], 16).astype(np.int8)
        scale = d
        offset = d * np.float32(-8) if type_name == "Q4_0" else _f16(b[:, 2:4])
    elif type_name == "Q4_K":
        d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
        sc_raw = b[:, 4:16].reshape(-1, 3, 4)
        dd, mm, md = sc_raw[:, 0], sc_raw[:, 1], sc_raw[:, 2]
        sc = np.concatenate([dd & 0x3F, (md & 0x0F) | ((dd >> 2) & 0x30)], axis=-1)
        mn = np.concatenate([mm & 0x3F, (md >> 4) | ((mm >> 2) & 0x30)], axis=-1)
        scale = d * sc.astype(np.float32)  # [blocks, 8] sub-blocks of 32: exact products
        offset = -(dmin * mn.astype(np.float32))
        q = _nibbles(b[:, 16:].reshape(-1, 4, 32), 32).reshape(-1, 256).astype(np.int8)
    else:  # Q6_K
        ql, qh = b[:, :128], b[:, 128:192]
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        scale = _f16(b[:, 208:210]) * sc  # [blocks, 16] sub-blocks of 16
        low = _nibbles(ql.reshape(-1, 2, 64), 64).reshape(-1, 2, 4, 32)
        high = np.stack([(qh.reshape(-1, 2, 32) >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
        q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(-1, 256)
    groups = k // GROUP[fmt]
    return QuantRows(
        fmt,
        torch.from_numpy(np.ascontiguousarray(q).reshape(n, k)),
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n, groups)),
        None if offset is None else torch.from_numpy(np.ascontiguousarray(offset).reshape(n, groups)),
    )
