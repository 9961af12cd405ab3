"""What transformers' GGUF config reader leaves out of a Gemma 2 or Gemma 3 file, read
from the keys llama.cpp's converter writes and its loader (``src/models/gemma{2,3}.cpp``)
reads, and set on the config transformers built:

- ``query_pre_attn_scalar``: llama.cpp stores none; it scales queries by
  ``1 / sqrt(head_dim)``, or ``1 / sqrt(hidden / heads)`` for the 27B models (46 layers
  for Gemma 2, 62 for Gemma 3), which is what their configs hold;
- the soft-caps: ``attn_logit_softcapping`` (Gemma 2) and ``final_logit_softcapping``
  (both; absent in a Gemma 3 file means none, not the config class's default);
- ``layer_types`` from ``attention.sliding_window_pattern`` (one flag a layer, or a
  period ``n``: every ``n``-th layer full), defaulting as llama.cpp does to 2 (Gemma 2)
  and 6 (Gemma 3); Gemma 3 without ``attention.sliding_window`` has no sliding layers;
- Gemma 3's rotary bases: ``rope.freq_base`` for the full layers (with linear
  ``rope.scaling.*``), ``rope.freq_base_swa`` for the sliding ones (default 10000).

The norm weights (stored with Gemma's ``+ 1`` added) are shifted back by transformers'
tensor processor for ``gemma2`` and ``gemma3``, on both our load paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_PATTERN = {"gemma2": 2, "gemma3": 6}
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}


def _layer_types(pattern: Any, arch: str, num_layers: int) -> list[str]:
    if isinstance(pattern, list):
        sliding = [bool(flag) for flag in pattern]
    else:
        period = int(pattern) if pattern else _PATTERN[arch]
        sliding = [(i + 1) % period != 0 for i in range(num_layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def fix_gemma_config(config: Any, arch: str, field: Callable[[str], Any]) -> None:
    """``field(key)``: the file's ``<arch>.<key>`` value, or None."""
    layers = config.num_hidden_layers
    if layers == _LAYERS_27B[arch]:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
    else:
        config.query_pre_attn_scalar = config.head_dim
    final_cap = field("final_logit_softcapping")
    config.final_logit_softcapping = float(final_cap) if final_cap else None
    if arch == "gemma2":
        attn_cap = field("attn_logit_softcapping")
        config.attn_logit_softcapping = float(attn_cap) if attn_cap else None
    window = field("attention.sliding_window")
    if arch == "gemma3" and not window:
        config.layer_types = ["full_attention"] * layers
    else:
        config.layer_types = _layer_types(field("attention.sliding_window_pattern"), arch, layers)
    if arch != "gemma3":
        return
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field("rope.freq_base") or 1e6)}
    if field("rope.scaling.type") == "linear":
        full.update(rope_type="linear", factor=float(field("rope.scaling.factor")))
    local = {"rope_type": "default", "rope_theta": float(field("rope.freq_base_swa") or 10000.0)}
    config.rope_parameters = {"full_attention": full, "sliding_attention": local}
