"""Checkpoints that fuse projections our layers keep apart (Phi-3: ``qkv_proj`` and
``gate_up_proj``): split at load into the separate HF names the layers have.

The layers fuse them again where it pays (one packed q/k/v product and one gate/up
kernel on the CPU); keeping one parameter layout for every family is what lets every
family share those paths, the quantized loaders and the decode stack's checks.
"""

from __future__ import annotations

import torch

from inference.model_config import ModelConfig

_LAYER = "model.layers."


def split_fused_projections(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """``self_attn.qkv_proj`` -> ``q_proj``/``k_proj``/``v_proj`` (rows in that order)
    and ``mlp.gate_up_proj`` -> ``gate_proj``/``up_proj`` (gate rows first), weights and
    biases, in place; names already separate are left alone. The pieces are views of
    the fused tensor (no copy)."""
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    for name in [n for n in weights if n.startswith(_LAYER)]:
        prefix, _, kind = name.rpartition(".")  # kind: weight or bias
        if prefix.endswith(".self_attn.qkv_proj"):
            base = prefix.removesuffix("qkv_proj")
            fused = weights.pop(name)
            if fused.shape[0] != q_rows + 2 * kv_rows:
                raise ValueError(f"{name}: {fused.shape[0]} rows, expected {q_rows + 2 * kv_rows} (q, k, v)")
            for part, piece in zip(
                ("q_proj", "k_proj", "v_proj"), fused.split([q_rows, kv_rows, kv_rows]), strict=True
            ):
                weights[f"{base}{part}.{kind}"] = piece
        elif prefix.endswith(".mlp.gate_up_proj") and ".experts." not in prefix:
            base = prefix.removesuffix("gate_up_proj")
            fused = weights.pop(name)
            if fused.shape[0] != 2 * config.intermediate_size:
                raise ValueError(f"{name}: {fused.shape[0]} rows, expected {2 * config.intermediate_size}")
            gate, up = fused.chunk(2)
            weights[f"{base}gate_proj.{kind}"], weights[f"{base}up_proj.{kind}"] = gate, up
    return weights
