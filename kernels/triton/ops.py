"""The Triton kernels the engine uses on CUDA, one import away.

Importing this module imports triton; ``chatsite_kernels.reference`` (the CPU path)
never does. Each function has the semantics of its reference in
``chatsite_kernels.reference`` (see docs/interfaces.md).
"""

from __future__ import annotations

from chatsite_kernels.triton.gated_delta import gated_delta_varlen
from chatsite_kernels.triton.mla_decode import mla_decode_attention
from chatsite_kernels.triton.paged_decode import paged_decode_attention
from chatsite_kernels.triton.paged_prefill import paged_prefill_attention
from chatsite_kernels.triton.quant_matmul import quant_matmul
from chatsite_kernels.triton.rmsnorm import fused_add_rms_norm
from chatsite_kernels.triton.rotary import rotary_embedding_
from chatsite_kernels.triton.store_kv import store_kv

__all__ = [
    "fused_add_rms_norm",
    "gated_delta_varlen",
    "mla_decode_attention",
    "paged_decode_attention",
    "paged_prefill_attention",
    "quant_matmul",
    "rotary_embedding_",
    "store_kv",
]
