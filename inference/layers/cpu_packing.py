"""The CPU kernels' weights over a decoder's life, for decoders with Hugging Face's
layout (``model.embed_tokens``, ``model.layers[i].self_attn`` / ``.mlp``, ``lm_head``):

- at load, GGUF blocks the kernels read stay quantized: ``split_quantized`` picks them
  out of the state dict and ``install_quantized`` packs them into panels in place of
  the fp32 parameters;
- at engine start, ``pack_weights`` makes the fp32 panels the GEMMs read now rather
  than in the first request, and can drop the originals they replace, so each weight
  is held once (then ``inference.layers.cpu_decode_stack`` may chain the whole step).

Each layer keeps its own panels and re-packs them when a weight changes; this module
only walks the decoder and tells each layer when.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import QuantRows

_EMBED = "model.embed_tokens.weight"
_LM_HEAD = "lm_head.weight"


def split_quantized(
    state_dict: Mapping[str, torch.Tensor],
    params: Mapping[str, torch.Tensor],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> tuple[dict[str, QuantRows], dict[str, torch.Tensor]]:
    """``(rows kept quantized, plain tensors)``. ``QuantRows`` of the model's own weights
    (``params``, or the LM head) stay quantized where the model runs on the CPU in fp32
    with the quantized kernel; anywhere else they are de-quantized (exactly). Raises
    ValueError for a quantized weight of the wrong shape."""
    quantize = (
        (device is None or torch.device(device).type == "cpu")
        and dtype in (None, torch.float32)
        and cpu_quant.available()
    )
    quantized: dict[str, QuantRows] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, QuantRows) and quantize and (name in params or name == _LM_HEAD):
            quantized[name] = tensor
        elif isinstance(tensor, QuantRows):  # no quantized kernel here: de-quantize (exact)
            plain[name] = tensor.dequantize()
        else:
            plain[name] = tensor
    for name, rows in quantized.items():
        expected = params[_EMBED if name == _LM_HEAD else name].shape
        if rows.shape != tuple(expected):
            raise ValueError(f"{name}: checkpoint shape {rows.shape} != {tuple(expected)}")
    return quantized, plain


def install_quantized(model: Any, rows: dict[str, QuantRows]) -> None:
    """Pack the quantized weights (fusing q/k/v and gate/up where their formats
    match) and drop the fp32 parameters they replace."""
    for i, layer in enumerate(model.model.layers):
        for part in ("self_attn", "mlp"):
            prefix = f"model.layers.{i}.{part}."
            mine = {n[len(prefix) : -len(".weight")]: r for n, r in rows.items() if n.startswith(prefix)}
            if mine:
                getattr(layer, part).set_quantized(mine)
    tied = model.config.tie_word_embeddings
    embed = rows.get(_EMBED)
    if embed is not None:
        packed = cpu_quant.pack(embed)
        model.model.embed_tokens.quant, model.model.embed_tokens.weight = packed, None
        if tied:
            model.lm_head.set_quantized(packed)  # one copy serves both
    if _LM_HEAD in rows and not tied:
        model.lm_head.set_quantized(cpu_quant.pack(rows[_LM_HEAD]))


def pack_weights(model: Any, *, release: bool = False) -> None:
    """Make the packed copies the CPU kernels read (nothing happens off the CPU, outside
    fp32, or without the kernels; quantized weights were packed at load). ``release``:
    drop each layer's fp32 originals as soon as that layer is packed, so at most one
    layer is held twice, then the LM head's; a tied embedding then reads its rows from
    the LM head's panels."""
    for layer in model.model.layers:
        layer.self_attn.prepare_packed()
        layer.mlp.prepare_packed()
        if release:
            layer.self_attn.release_weights()
            layer.mlp.release_weights()
    model.lm_head.prepare_packed()
    if release:
        _release_head(model)


def _release_head(model: Any) -> None:
    embed, head = model.model.embed_tokens, model.lm_head
    if model.config.tie_word_embeddings and head.quant is None and head._packed is not None:
        embed.panels, embed.weight = head.packed_weight(), None
    head.release_weight()
