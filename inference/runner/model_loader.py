"""Load a checkpoint into our own decoder.

Two sources:
- a Hugging Face model directory (``config.json`` + ``*.safetensors``);
- a GGUF file, read and de-quantised through transformers' GGUF support. That
  takes ~10 s for SmolLM2, so the first load writes the de-quantised weights,
  config and tokenizer as an ordinary HF directory under the weights cache, and
  later loads read that directory instead (about a second). On the CPU in fp32 the
  engine instead keeps the GGUF's quantized blocks (``inference.runner.gguf``,
  ``chatsite_kernels.cpu.quant``) and takes only the config and tokenizer from the cache.

transformers is used for configs, tokenizers and GGUF parsing only; inference
always runs on ``inference.models``.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from chatsite_kernels.cpu import quant as cpu_quant
from inference.model_config import ModelConfig
from inference.models import CausalLM, build_model
from inference.models.registry import read_model_config
from inference.runner.gguf import gpt_oss as gpt_oss_gguf
from inference.runner.gguf.config_fixes import fix_gguf_config
from inference.runner.gguf.names import gguf_index_names
from inference.runner.gguf.own_reader import gguf_architecture, open_gguf, read_gpt_oss_gguf
from inference.runner.gguf.weights import load_index, read_gguf_weights
from inference.runner.model_files import default_model_path
from inference.runner.weights_identity import source_identity, tag
from inference.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "CHATSITE_WEIGHTS_CACHE"
_COMPLETE_MARKER = "chatsite-complete.json"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None/"auto": bf16 on CUDA, fp32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    names |= {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    try:
        return names[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(names)}") from None


def weights_cache_root(weights_cache_dir: str | os.PathLike[str] | None = None) -> Path:
    if weights_cache_dir is not None:
        return Path(weights_cache_dir).expanduser()
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    return Path.home() / ".cache" / "chatsite-weights"


# Part of the cache key: bump it whenever what the cache directory holds changes.
# 2: a tensor index of the GGUF (``inference.runner.gguf.weights``) next to the weights.
CACHE_FORMAT = 2


def gguf_cache_dir(gguf_path: Path, weights_cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/<stem>-<size>-<hash of mtime and cache format>``: a replaced file, or a
    new cache format, gets a fresh entry."""
    stat = gguf_path.stat()
    stamp = hashlib.sha256(f"{stat.st_mtime_ns}|{CACHE_FORMAT}".encode()).hexdigest()[:12]
    return weights_cache_root(weights_cache_dir) / f"{gguf_path.stem}-{stat.st_size}-{stamp}"


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    weights_cache_dir: str | os.PathLike[str] | None = None,
    *,
    quantized: bool | None = None,
) -> tuple[CausalLM, Tokenizer, ModelConfig]:
    """Load ``path`` (HF dir or ``.gguf``; None = the default SmolLM2 GGUF) into our model.

    Returns ``(model, tokenizer, model_config)``; the model is in eval mode on
    ``device`` in ``dtype``. Raises ``UnsupportedModelError`` for other architectures
    before reading any weights.

    ``quantized`` (GGUF only; None = wherever possible): keep the GGUF's block-quantized
    tensors as they are for the CPU kernels (``chatsite_kernels.cpu.quant``), reading them from
    the GGUF itself; the cache then supplies only the config and tokenizer. Needs the
    CPU, fp32 and gcc; otherwise the cache's de-quantized weights are loaded.
    """
    started = time.perf_counter()
    source = Path(path).expanduser() if path is not None else default_model_path()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    gguf_source: Path | None = None
    if source.is_file() and source.suffix == ".gguf":
        model_dir = ensure_gguf_converted(source, weights_cache_dir)
        name = source.stem
        if quantized is None:
            quantized = torch_device.type == "cpu" and torch_dtype == torch.float32 and cpu_quant.available()
        gguf_source = source if quantized else None
    elif source.is_dir():
        model_dir, name = source, source.name
    else:
        raise FileNotFoundError(f"model path {source} is neither a model directory nor a .gguf file")

    hf_config = _load_hf_config(model_dir)
    model_config = read_model_config(hf_config, name=name)
    if model_config.gpt_oss is not None:
        gguf_source = None  # no block kernels for it: the cache holds its de-quantized weights
    tokenizer = load_tokenizer(model_dir, model_config)
    with torch.device("meta"):  # no allocation or random init: weights are assigned next
        model = build_model(model_config)
    if gguf_source is not None:
        index = load_index(gguf_source, model_dir, gguf_index_names(model.state_dict(), model_config))
        state_dict = read_gguf_weights(gguf_source, index, hf_config)
    else:
        state_dict = load_state_dict(model_dir)
    model.load_weights(state_dict, device=torch_device, dtype=torch_dtype)
    model.eval()
    # What the KV disk tier's fingerprint names: the files' bytes, not the tensors left after packing.
    identity = source_identity(
        gguf_source or source,
        quantized=gguf_source is not None,
        dtype=torch_dtype,
        cache_root=weights_cache_root(weights_cache_dir),
    )
    tag(model, identity)
    del state_dict
    release_free_heap()
    logger.info(
        "loaded %s (%s) on %s/%s in %.1fs",
        name,
        model_config.architecture,
        torch_device,
        torch_dtype,
        time.perf_counter() - started,
    )
    return model, tokenizer, model_config


def release_free_heap() -> None:
    """Hand the heap memory that loading freed (parsed blocks, numpy temporaries) back
    to the OS: glibc keeps it otherwise, ~160 MB of resident memory for SmolLM2."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _load_hf_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError):
        # transformers does not know the model_type: still report the architecture by name.
        raw = json.loads((model_dir / "config.json").read_text())
        from inference.errors import UnsupportedModelError

        arch = (raw.get("architectures") or [raw.get("model_type", "unknown")])[0]
        raise UnsupportedModelError(arch) from None


def load_tokenizer(model_dir: Path, model_config: ModelConfig | None = None) -> Tokenizer:
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return Tokenizer(hf_tokenizer, extra_eos_token_ids=model_config.eos_token_ids if model_config else ())


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a directory's safetensors files (sharded or not), on CPU."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    state_dict: dict[str, torch.Tensor] = {}
    for file in files:
        state_dict.update(load_file(file))
    return state_dict


def ensure_gguf_converted(gguf_path: Path, weights_cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The HF-format cache directory for ``gguf_path``, converting on first use.

    Writes into a private temporary directory and renames it into place, so readers
    never see a half-written cache; a file lock makes concurrent processes wait for
    one conversion instead of each doing their own."""
    target = gguf_cache_dir(gguf_path, weights_cache_dir)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Serialise conversions (web workers and task workers may start together): the
    # others wait, then find the finished cache instead of converting again.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _COMPLETE_MARKER).is_file():
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed converter (we hold the lock)
        _convert_gguf(gguf_path, target)
    return target


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    started = time.perf_counter()
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        config, tokenizer, tensors = read_gguf(gguf_path)
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            tmp / "model.safetensors",
            metadata={"format": "pt"},
        )
        marker = {
            "source": str(gguf_path),
            "size": gguf_path.stat().st_size,
            "seconds": time.perf_counter() - started,
        }
        (tmp / _COMPLETE_MARKER).write_text(json.dumps(marker))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():
                # A stale incomplete dir (crash mid-write before we used tmp dirs): replace it.
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s to %s in %.1fs", gguf_path.name, target, time.perf_counter() - started)


def read_gguf(gguf_path: Path) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """(HF config, HF tokenizer, de-quantised fp32 state dict with HF names) from a GGUF.

    ``from_pretrained(gguf_file=...)`` for the model would need ``accelerate``; the
    tensor conversion it wraps (``load_gguf_checkpoint``) only needs a model skeleton
    to map names, so we build one on the meta device (no memory, no init)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    reader = open_gguf(gguf_path)  # parsed once for the architecture and the config fixes
    if gguf_architecture(gguf_path, reader) == gpt_oss_gguf.ARCHITECTURE:
        return read_gpt_oss_gguf(gguf_path, reader)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    fix_gguf_config(config, gguf_path, reader)
    read_model_config(config)  # fail fast on unsupported architectures, before de-quantising
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    tensors: dict[str, torch.Tensor] = parsed["tensors"]
    if not config.architectures:
        config.architectures = [type(skeleton).__name__]
    return config, tokenizer, tensors
