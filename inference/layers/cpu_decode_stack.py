"""The one-call CPU decode step of a Llama-style model (``chatsite_kernels.cpu.decode_stack``):
which models qualify, and their layers described for the kernel.

It qualifies when every product of every layer already runs on the CPU kernels from
panels that are the weight's only copy (quantized GGUF blocks, or fp32 panels after
``cpu_packing.pack_weights`` released the originals), the norms are fp32 and the
layers share one shape; otherwise the model keeps its per-op path for every step.
"""

from __future__ import annotations

from typing import Any

import torch

from chatsite_kernels.cpu import decode_stack as cpu_decode_stack
from chatsite_kernels.cpu.decode_stack import DecodeStack, StackLayer, StackLinear, StackShape

# The decoder is taken by its attributes, down to the panels its layers keep
# (``gqa_attention.Attention``, ``mlp.MLP``, ``linear.Linear``): the models import
# this module, so it must not import them.


def _single(linear: Any) -> StackLinear | None:
    if linear.quant is not None:
        return StackLinear(linear.quant, linear.bias)
    if linear.weight is None and linear._packed is not None:
        return StackLinear(linear._packed, linear.bias)
    return None


def _qkv(attn: Any) -> StackLinear | None:
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    biases = [p.bias for p in projections if p.bias is not None]
    if len(biases) not in (0, 3):
        return None
    bias = torch.cat(biases) if biases else None
    if attn._qkv_quant is not None:
        return StackLinear(attn._qkv_quant, bias)
    if attn.q_proj.weight is None and attn._packed is not None:
        return StackLinear(attn._packed[0], attn._packed[1])
    return None


def _gate_up(mlp: Any) -> StackLinear | None:
    if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
        return None
    if mlp._gate_up_quant is not None:
        return StackLinear(mlp._gate_up_quant)
    if mlp.gate_proj.weight is None and mlp._packed is not None:
        return StackLinear(mlp._packed)
    return None


def _fp32_cpu(t: torch.Tensor | None) -> bool:
    return t is not None and t.dtype == torch.float32 and t.device.type == "cpu"


def build_decode_stack(model: Any) -> DecodeStack | None:
    """The model's layers for the one-call decode step, or None where it does not apply."""
    config = model.config
    layers: list[StackLayer] = []
    intermediate = {layer.mlp.gate_proj.out_features for layer in model.model.layers}
    norms = [model.model.norm] + [
        n for layer in model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    if len(intermediate) > 1 or any(n.eps != config.rms_norm_eps or not _fp32_cpu(n.weight) for n in norms):
        return None
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        parts = (_qkv(attn), _single(attn.o_proj), _gate_up(mlp), _single(mlp.down_proj))
        if any(p is None for p in parts):
            return None
        if any(p.fmt == cpu_decode_stack.FMT_F32 and not _fp32_cpu(p.data) for p in parts):  # type: ignore[union-attr]
            return None
        layers.append(
            StackLayer(
                layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(), *parts
            )
        )  # type: ignore[arg-type]
    if not cpu_decode_stack.available():
        return None
    shape = StackShape(
        hidden=config.hidden_size,
        q_heads=config.num_heads,
        kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        intermediate=intermediate.pop() if intermediate else 1,
        eps=config.rms_norm_eps,
        scale=config.head_dim**-0.5,
    )
    return DecodeStack(layers, model.model.norm.weight.detach(), shape)
