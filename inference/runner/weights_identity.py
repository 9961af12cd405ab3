"""Which weights a model serves, as a small dict: part of the KV disk tier's fingerprint.

K/V computed by one model are wrong for any other, so the disk tier must never serve a
block across models, even ones of the same shape (a Q8_0 build of the same model, a
fine-tune). The model's own tensors are a poor witness: on the CPU the linear weights are
dropped once packed, and quantized ones never were parameters. So ``load_model`` tags the
model with what it was loaded from: a digest of the files' bytes (the GGUF, or an HF
directory's safetensors and ``config.json``), whether the GGUF's blocks are served as they
are, and the dtype. A model built some other way (a test's stand-in) untagged gets a
digest of every tensor it serves, quantized panels and packed copies included.

Hashing the files costs ~0.5 s per GB (xxh3-128: 54 ms for SmolLM2's 98 MB GGUF), so a
file's digest is kept by path, size and modification time: in the process, and for files
of ``PERSIST_MIN_BYTES`` or more under the weights cache (``digests/``), so a restart does
not read hundreds of MB again. xxh3 is no cryptographic hash: this identifies
weights an operator chose; it does not defend against one crafting a collision.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
import xxhash

logger = logging.getLogger(__name__)

ATTRIBUTE = "weights_identity"
_CHUNK = 1 << 22
PERSIST_MIN_BYTES = 16 << 20  # smaller files hash in milliseconds: not worth a cache file
# Where layers keep weights outside their parameters (inference.layers: Linear.quant and
# ._packed, the fused q/k/v and gate/up panels, a tied embedding's panels).
KERNEL_WEIGHTS = ("quant", "_packed", "_qkv_quant", "_gate_up_quant", "panels")
_digests: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path, cache_root: Path | None = None) -> str:
    """xxh3-128 of ``path``'s bytes, remembered by (path, size, mtime) in this process and,
    with ``cache_root``, in a small file under it."""
    resolved = path.resolve()
    info = resolved.stat()
    key = (str(resolved), info.st_size, info.st_mtime_ns)
    if key in _digests:
        return _digests[key]
    stored = None
    if cache_root is not None and info.st_size >= PERSIST_MIN_BYTES:
        name = hashlib.sha256("|".join(map(str, key)).encode()).hexdigest()[:32]
        stored = cache_root / "digests" / name
        try:
            _digests[key] = stored.read_text().strip()
            return _digests[key]
        except OSError:
            pass
    digest = xxhash.xxh3_128()
    with open(resolved, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    _digests[key] = digest.hexdigest()
    if stored is not None:
        _remember(stored, _digests[key])
    return _digests[key]


def _remember(stored: Path, digest: str) -> None:
    """Keep a digest for the next process; a cache that cannot be written only costs time."""
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = stored.with_name(f"{stored.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        os.replace(tmp, stored)
    except OSError as exc:
        logger.debug("weights digest not cached at %s: %s", stored, exc)


def source_identity(
    source: Path, *, quantized: bool, dtype: torch.dtype, cache_root: Path | None = None
) -> dict[str, Any]:
    """What a model loaded from ``source`` (a ``.gguf`` file or an HF directory) serves."""
    if source.is_file():
        files = {source.name: file_digest(source, cache_root)}
    else:
        names = sorted(p for p in source.glob("*.safetensors")) + [source / "config.json"]
        files = {p.name: file_digest(p, cache_root) for p in names if p.is_file()}
    return {"files": files, "quantized": bool(quantized), "dtype": str(dtype)}


def tag(model: torch.nn.Module, identity: dict[str, Any]) -> None:
    setattr(model, ATTRIBUTE, identity)


def weights_identity(model: torch.nn.Module) -> dict[str, Any]:
    """The tag ``load_model`` left, or a digest of the tensors the model serves."""
    tagged = getattr(model, ATTRIBUTE, None)
    return dict(tagged) if tagged is not None else {"served": served_weights_digest(model)}


def served_weights_digest(model: torch.nn.Module) -> str:
    """Every tensor the model computes with: parameters and buffers, and the copies the CPU
    kernels read instead (quantized panels, packed weights whose fp32 original was
    dropped). On an accelerator a strided sample of each: hashing every byte there would
    copy all weights to the host at start."""
    digest = xxhash.xxh3_128()
    for module_name, module in sorted(model.named_modules(), key=lambda item: item[0]):
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        tensors += _kernel_copies(module)
        for name, tensor in sorted(tensors, key=lambda item: item[0]):
            digest.update(f"{module_name}.{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
            flat = tensor.detach().reshape(-1)
            if flat.device.type != "cpu":
                flat = flat[:: max(1, flat.numel() // 4096)].cpu()
            if flat.numel():
                digest.update(flat.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _kernel_copies(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights a layer holds outside its parameters: quantized panels (``PackedQuant``)
    and packed fp32 panels, which are the only copy once the originals are dropped. They
    exist by the time the tiers are built (the model runner packs at engine start)."""
    found: list[tuple[str, torch.Tensor]] = []
    for name in KERNEL_WEIGHTS:
        held = module.__dict__.get(name)
        parts = held if isinstance(held, tuple) else (held,)
        for i, part in enumerate(parts):
            tensor = getattr(part, "data", part)  # a PackedQuant holds its blocks in .data
            if isinstance(tensor, torch.Tensor):
                found.append((f"{name}[{i}]:{getattr(part, 'fmt', '')}", tensor))
    return found
