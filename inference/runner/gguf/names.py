"""The Hugging Face names a GGUF's tensors may carry for a model: its own parameters, plus
the checkpoint layouts its loader converts from (``load_weights``):

- fused ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` (Phi-3, whose llama.cpp files
  hold ``attn_qkv`` and a double-height ``ffn_up``; split at load). Only for those
  architectures: gguf-py maps ``gate_up_proj`` and ``up_proj`` alike to ``ffn_up``;
- routed experts stacked per projection, ``mlp.experts.{gate,up,down}_proj.weight``
  ``[E, N, K]`` (GGUF's ``ffn_*_exps``; joined into ``gate_up_proj`` at load).

A name the file lacks simply maps nothing (``build_index`` keeps the tensors it finds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from inference.model_config import ModelConfig

_FUSED_ARCHITECTURES = frozenset({"Phi3ForCausalLM"})

_ATTN = re.compile(r"^(model\.layers\.\d+\.self_attn\.)q_proj\.(weight|bias)$")
_MLP = re.compile(r"^(model\.layers\.\d+\.mlp\.)gate_proj\.(weight|bias)$")
_KV_UP = re.compile(r"^model\.layers\.\d+\.(self_attn\.[kv]_proj|mlp\.up_proj)\.(weight|bias)$")
_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)gate_up_proj$")


def gguf_index_names(param_names: Iterable[str], config: ModelConfig) -> list[str]:
    names = [*param_names, "lm_head.weight"]
    fused = config.architecture in _FUSED_ARCHITECTURES
    extra: list[str] = []
    for name in names:
        if fused and (m := _ATTN.match(name)):
            extra.append(f"{m[1]}qkv_proj.{m[2]}")
        elif fused and (m := _MLP.match(name)):
            extra.append(f"{m[1]}gate_up_proj.{m[2]}")
        elif m := _EXPERTS.match(name):
            extra += [f"{m[1]}{p}_proj.weight" for p in ("gate", "up", "down")]
    if fused:  # the separate names would claim the fused tensors too
        names = [n for n in names if not (_ATTN.match(n) or _MLP.match(n) or _KV_UP.match(n))]
    return names + extra
