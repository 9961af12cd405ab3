"""A GGUF file's tensors with Hugging Face names, quantized blocks kept as they are.

Tensors of a type the CPU kernels read (``blocks.GGUF_TYPES``) come back as
``QuantRows`` (integer quants and per-group scales, never de-quantized); F32/F16
tensors and other types come back as fp32 tensors de-quantized by gguf-py, exactly as
transformers' loader does it, with one log line per unsupported type; MXFP4 (gpt-oss's
experts, which transformers does not read) by ``inference.runner.mxfp4.dequantize_gguf``.

Names come from gguf-py's tensor name map, and the Llama q/k row permutation from
transformers' tensor processor, so the result matches ``load_gguf_checkpoint`` tensor
for tensor. Rows permute and quantized blocks are per row, so the permutation is
applied to the raw blocks before parsing.

Parsing a GGUF's header (its tokenizer alone is ~150k fields) and mapping the names
take seconds, so the first load writes a small index (name, type, shape, offset of
each tensor) next to the weights cache, and later loads slice the memory-mapped file
by it.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chatsite_kernels.cpu.quant import QuantRows
from inference.runner.gguf.blocks import GGUF_TYPES, parse_gguf_blocks
from inference.runner.mxfp4 import dequantize_gguf

logger = logging.getLogger(__name__)

INDEX_FILE = "gguf-tensor-index.json"


class GGUFFormatError(ValueError):
    """A GGUF file whose tensor data does not match the shapes and types it declares."""


def check_tensor_sizes(reader: Any, file_size: int) -> None:
    """Every tensor's bytes, from its shape and type, fit the space the file gives it
    (up to the next tensor, or the end of the file, less alignment padding)."""
    from gguf import GGML_QUANT_SIZES

    tensors = sorted(reader.tensors, key=lambda t: t.data_offset)
    for i, t in enumerate(tensors):
        block, type_size = GGML_QUANT_SIZES[t.tensor_type]
        dims = [int(d) for d in t.shape]
        expected = int(np.prod(dims)) // block * type_size
        end = tensors[i + 1].data_offset if i + 1 < len(tensors) else file_size
        available = end - t.data_offset
        if dims[0] % block or expected > available or available - expected >= max(reader.alignment, 1):
            raise GGUFFormatError(
                f"GGUF tensor {t.name!r}: {t.tensor_type.name} of shape {dims} needs {expected} bytes, "
                f"but the file holds {available} for it"
            )


def build_index(gguf_path: Path, param_names: list[str]) -> dict[str, Any]:
    """``{"architecture", "tensors": [{hf, gguf, type, shape [N, K], offset, nbytes}]}``
    for the tensors of ``gguf_path`` that map to ``param_names``."""
    from gguf import MODEL_ARCH_NAMES, GGUFReader, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import read_field

    try:
        reader = GGUFReader(str(gguf_path))
    except (ValueError, IndexError) as exc:  # truncated or inconsistent headers
        raise GGUFFormatError(f"{gguf_path.name}: not a readable GGUF file ({exc})") from exc
    check_tensor_sizes(reader, gguf_path.stat().st_size)
    architecture = str(read_field(reader, "general.architecture")[0])
    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == architecture), None)
    if arch is None:
        raise GGUFFormatError(f"{gguf_path.name}: unknown GGUF architecture {architecture!r}")
    layers = 1 + max((int(n.split(".")[2]) for n in param_names if n.startswith("model.layers.")), default=-1)
    name_map = get_tensor_name_map(arch, layers)
    to_hf = {}
    for hf in param_names:
        base, _, suffix = hf.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is not None:
            to_hf[f"{gguf_name}.{suffix}"] = hf
    entries = [
        {
            "hf": to_hf[t.name],
            "gguf": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in reversed(t.shape)],
            "offset": int(t.data_offset),
            "nbytes": int(t.n_bytes),
        }
        for t in reader.tensors
        if t.name in to_hf
    ]
    return {"architecture": architecture, "file_size": gguf_path.stat().st_size, "tensors": entries}


def load_index(gguf_path: Path, cache_dir: Path, param_names: list[str]) -> dict[str, Any]:
    """The index from ``cache_dir``, built and written there (atomically) on first use."""
    path = cache_dir / INDEX_FILE
    if path.is_file():
        index = json.loads(path.read_text())
        if index.get("file_size") == gguf_path.stat().st_size:
            return index
    index = build_index(gguf_path, param_names)
    tmp = cache_dir / f".{INDEX_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(index))
    os.replace(tmp, path)
    return index


def read_gguf_weights(
    gguf_path: Path, index: dict[str, Any], hf_config: Any, blocks: bool = True
) -> dict[str, torch.Tensor | QuantRows]:
    """HF name -> ``QuantRows`` (kernel types, where ``blocks``) or fp32 tensor, read by ``index``."""
    from gguf import GGMLQuantizationType, dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(index["architecture"], TensorProcessor)(config=hf_config.to_dict())
    # Only processors that permute rows (or nothing) commute with keeping the blocks. The
    # MoE one (qwen2moe, qwen3moe) changes nothing of a 2-D tensor that is not a shared-expert
    # gate; its 3-D expert stacks are de-quantized below in any case.
    keep_blocks = blocks and type(processor).process in (
        TensorProcessor.process,
        TENSOR_PROCESSORS["llama"].process,
        TENSOR_PROCESSORS["qwen3moe"].process,
    )
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    if data.size != index["file_size"]:
        raise GGUFFormatError(f"{gguf_path.name} changed size since it was indexed")
    out: dict[str, torch.Tensor | QuantRows] = {}
    logged: set[str] = set()
    for entry in index["tensors"]:
        type_name, shape, offset = entry["type"], tuple(entry["shape"]), entry["offset"]
        raw = data[offset : offset + entry["nbytes"]]
        if len(shape) == 2 and raw.size % shape[0] == 0:
            raw = raw.reshape(shape[0], -1)
        if keep_blocks and type_name in GGUF_TYPES and len(shape) == 2 and "_shexp" not in entry["gguf"]:
            raw = processor.process(weights=raw, name=entry["gguf"]).weights
            out[entry["hf"]] = parse_gguf_blocks(type_name, np.asarray(raw), shape)  # type: ignore[arg-type]
            continue
        if type_name == "MXFP4":  # gpt-oss's experts: our de-quantizer of ggml's block_mxfp4
            rows = np.array(raw, copy=True).reshape(int(np.prod(shape[:-1])), -1)
            out[entry["hf"]] = dequantize_gguf(torch.from_numpy(rows), shape[-1]).reshape(shape)
            continue
        if type_name not in ("F32", "F16") and type_name not in logged:
            logged.add(type_name)
            logger.info("GGUF type %s has no quantized kernel: de-quantizing it to fp32", type_name)
        weights = dequantize(np.asarray(raw), GGMLQuantizationType[type_name]).reshape(shape)
        weights = processor.process(weights=weights, name=entry["gguf"]).weights
        out[entry["hf"]] = torch.from_numpy(np.array(weights, dtype=np.float32))
    return out
