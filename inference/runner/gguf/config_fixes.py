"""What transformers' GGUF config reader leaves out for the families we serve, read from
the GGUF's own metadata and set on the config it built:

- ``head_dim`` from ``<arch>.attention.key_length`` (transformers maps it for qwen3moe
  only; a Qwen3 whose head_dim is not hidden / heads would otherwise get the default);
- ``moe_intermediate_size`` from ``<arch>.expert_feed_forward_length`` (unmapped: every
  MoE would get its config class's default expert width);
- Phi-3's partial rotary (``<arch>.rope.dimension_count``) and LongRoPE: llama.cpp keeps
  the factors as the tensors ``rope_factors_long`` / ``rope_factors_short`` and the
  original context and attention factor as ``<arch>.rope.scaling.*`` keys.

Gemma 2 and 3 have their own list (``inference.runner.gguf.gemma_config``).

Without these the converted model would run with the wrong shapes or rotation.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.runner.gguf.gemma_config import fix_gemma_config

if TYPE_CHECKING:
    from gguf import GGUFReader


def fix_gguf_config(config: Any, gguf_path: Path, reader: GGUFReader | None = None) -> None:
    """``reader``: the file already parsed (``own_reader.open_gguf``), else it is parsed here."""
    from gguf import GGUFReader

    reader = reader if reader is not None else GGUFReader(str(gguf_path))
    arch = str(reader.fields["general.architecture"].contents())

    def field(key: str) -> Any:
        found = reader.fields.get(f"{arch}.{key}")
        return None if found is None else found.contents()

    key_length = field("attention.key_length")
    if key_length and hasattr(config, "head_dim"):
        config.head_dim = int(key_length)
    expert_width = field("expert_feed_forward_length")
    if expert_width and hasattr(config, "moe_intermediate_size"):
        config.moe_intermediate_size = int(expert_width)
    if arch in ("gemma2", "gemma3"):
        fix_gemma_config(config, arch, field)
    if arch != "phi3":
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope: dict[str, Any] = dict(getattr(config, "rope_parameters", None) or {})
    rotary = field("rope.dimension_count")
    if rotary and int(rotary) != head_dim:
        rope["partial_rotary_factor"] = int(rotary) / head_dim
    factors = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1).tolist() for t in reader.tensors}
    long, short = factors.get("rope_factors_long.weight"), factors.get("rope_factors_short.weight")
    if long is not None and short is not None:
        original = field("rope.scaling.original_context_length")
        rope.update(rope_type="longrope", long_factor=long, short_factor=short)
        if original:
            rope["original_max_position_embeddings"] = int(original)
            config.original_max_position_embeddings = int(original)
        attn_factor = field("rope.scaling.attn_factor")
        if attn_factor:
            rope["attention_factor"] = float(attn_factor)
    config.rope_parameters = rope
