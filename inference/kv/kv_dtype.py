"""The KV pool's element type (``EngineConfig.kv_cache_dtype``).

- ``"model"``: the model's own dtype (fp32 on the CPU): attention reads exactly what the
  layers computed.
- ``"float16"``: K and V stored as IEEE half precision, as llama.cpp stores them by
  default. A decode step over long histories spends much of its time reading K/V, and
  half the bytes cut it (on this 2-core CPU, 4 sequences of 1,500 tokens: 18.2 ms of
  fp32 attention a step against 11.5 ms, the whole step 28.0 against 21.8 ms), and the
  same memory budget holds twice the blocks. The cost is each stored value's rounding (a relative
  2^-11; values past 65,504 become infinite, as in ``Tensor.to(torch.float16)``); queries,
  scores and sums stay fp32. Every attention reads K/V as stored, a fresh prompt's own
  chunk included, so an answer does not depend on whether its prefix was cached.
- ``"auto"``: ``float16`` on the CPU, the model's dtype elsewhere (a CUDA model already
  runs in bf16 or fp16).

On CUDA ``float16`` is accepted only for a float16 model: the Triton kernels read the
cache in the model's dtype.
"""

from __future__ import annotations

import torch

from inference.config import KV_DTYPE_CHOICES as CHOICES


def resolve_kv_dtype(choice: str, device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """The pool dtype ``choice`` (one of ``CHOICES``) means for a model in ``model_dtype``
    on ``device``."""
    if choice not in CHOICES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "model" or (choice == "auto" and device.type != "cpu"):
        return model_dtype
    if device.type != "cpu" and model_dtype != torch.float16:
        raise ValueError(
            f"kv_cache_dtype 'float16' on {device.type} needs a float16 model (this one is {model_dtype}); "
            "use 'model' or 'auto'"
        )
    return torch.float16
