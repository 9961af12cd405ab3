"""Grouped-query self-attention of the Llama family (Llama, Mistral, Qwen2 and the
families sharing their decoder): q/k/v projections, optional q/k RMSNorm (per head as
Qwen3, over the whole projection as OLMo 2), rotary embeddings (of the whole head, of
its first features, or none on a NoPE layer), paged attention over the KV cache,
output projection.

On the CPU in fp32 q, k and v are one product over packed (or quantized) weights,
and where the whole head rotates one C call rotates q and k and stores k and v; a
partial rotary or NoPE layer rotates in PyTorch and lets attention store k and v."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from chatsite_kernels.cpu import linear as cpu_linear
from chatsite_kernels.cpu import quant as cpu_quant
from chatsite_kernels.cpu.quant import PackedQuant, QuantRows
from inference.layers.attention import paged_attention
from inference.layers.attention_context import AttentionContext
from inference.layers.bf16_weights import Bf16Weight
from inference.layers.linear import Linear, linear_released, packable, quant_linear, unpanel, weight_key
from inference.layers.norm import RMSNorm
from inference.layers.rotary import apply_rotary
from inference.layers.window_attention import AttentionFeatures, feature_attention
from inference.model_config import ModelConfig

if TYPE_CHECKING:
    from inference.layers.adapters import AttentionAdapters


class Attention(nn.Module):
    _packed: tuple[torch.Tensor, torch.Tensor | None] | None = None
    _packed_key: tuple[tuple[int, int], ...] | None = None
    _qkv_quant: PackedQuant | None = None  # q, k and v rows of one quantized format
    lora: AttentionAdapters | None = None  # LoRA adapters' products (inference.lora), when served
    _qkv_bf16: Bf16Weight | None = None  # q, k and v stacked, for many-row products

    def __init__(self, config: ModelConfig, layer_idx: int, kv_slot: tuple[int, int] | None = None) -> None:
        """``kv_slot``: the layer's (KV group, slot in a block) when the model has several
        KV groups (``KVSpec.layer_slots``); by default group 0, slot ``layer_idx``."""
        super().__init__()
        self.layer_idx = layer_idx
        self.kv_group, self.kv_slot = kv_slot if kv_slot is not None else (0, layer_idx)
        windows = config.layer_windows
        self.features = AttentionFeatures(window=windows[layer_idx] if windows else None)
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.softmax_scale
        self.use_rope = config.layer_uses_rope(layer_idx)
        # The C rotary-and-store call turns the whole head; anything else rotates in PyTorch.
        self.whole_head_rotary = self.use_rope and config.rotary_dim == config.head_dim
        qkv_bias = config.attention_bias
        hidden, q_size, kv_size = (
            config.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.q_proj = Linear(hidden, q_size, bias=qkv_bias)
        self.k_proj = Linear(hidden, kv_size, bias=qkv_bias)
        self.v_proj = Linear(hidden, kv_size, bias=qkv_bias)
        self.o_proj = Linear(q_size, hidden, bias=config.attention_out_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm is not None:
            per_head = config.qk_norm == "head"
            self.q_norm = RMSNorm(self.head_dim if per_head else q_size, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim if per_head else kv_size, config.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """``cos_sin`` ``[T, D]``: each token's rotary cos (first half) and sin (second)."""
        tokens, d = hidden.shape[0], self.head_dim
        hq, hkv = self.num_heads, self.num_kv_heads
        k_cache, v_cache = kv_cache[:, 0, self.kv_slot], kv_cache[:, 1, self.kv_slot]
        ctx = ctx.for_group(self.kv_group)
        qkv = self.fused_qkv(hidden)
        lora = self.lora if self.lora is not None and self.lora.active else None
        if lora is not None:  # the adapters' q/k/v products join the base's before norms and rotary
            if qkv is None:
                qkv = torch.cat([self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)], dim=-1)
            lora.add_qkv(hidden, qkv, (hq * d, hkv * d, hkv * d))
        if (
            qkv is not None
            and self.whole_head_rotary
            # An fp32 model may keep a float16 KV cache: the kernel rounds as the
            # PyTorch store does; the activations it rotates must be fp32.
            and cpu_layer_ops.is_cpu_f32(qkv, cos_sin)
            and cpu_layer_ops.is_cpu_cache(kv_cache)
            and cpu_layer_ops.available()
        ):
            # Decode steps are dominated by per-op overhead at these sizes: one packed
            # q/k/v product, then one call rotates q and k in place and stores k and v.
            if self.q_norm is not None:
                q, k = self.norm_qk(qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d])
                qkv[:, : hq * d] = q.view(tokens, hq * d)
                qkv[:, hq * d : (hq + hkv) * d] = k.view(tokens, hkv * d)
            cpu_layer_ops.rotary_store(qkv, hq, hkv, cos_sin, ctx.slot_mapping, k_cache, v_cache)
            q = qkv[:, : hq * d].view(tokens, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
            out = self._attend(q, k, v, k_cache, v_cache, ctx, kv_stored=True)
        else:
            if qkv is not None:
                q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            else:
                q, k, v = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
            if self.q_norm is not None:
                q, k = self.norm_qk(q, k)
            q, k = q.reshape(tokens, hq, d), k.reshape(tokens, hkv, d)
            if self.use_rope:
                half = cos_sin.shape[-1] // 2  # half the rotary features: the whole head or its first part
                cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # broadcast over heads
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            out = self._attend(q, k, v.reshape(tokens, hkv, d), k_cache, v_cache, ctx)
        out = out.reshape(tokens, hq * d)
        projected = self.o_proj(out)
        if lora is not None:
            lora.add_o(out, projected)
        return projected

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        ctx: AttentionContext,
        *,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        if self.features.plain:
            return paged_attention(q, k, v, k_cache, v_cache, ctx, self.scale, kv_stored=kv_stored)
        return feature_attention(
            q, k, v, k_cache, v_cache, ctx, self.scale, self.features, kv_stored=kv_stored
        )

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm of q ``[T, Hq*D]`` and k ``[T, Hkv*D]``, per head or over the whole
        projection; returns new contiguous tensors of the same shapes."""
        assert self.q_norm is not None and self.k_norm is not None
        q_rows = q.reshape(
            -1, self.q_norm.weight.shape[0]
        ).contiguous()  # [T * Hq, D] per head, else [T, Hq * D]
        k_rows = k.reshape(-1, self.k_norm.weight.shape[0]).contiguous()
        return self.q_norm(q_rows).view(q.shape), self.k_norm(k_rows).view(k.shape)

    def fused_qkv(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``[T, (Hq + 2 Hkv) D]`` from one product over the packed q/k/v weights, or
        None where the separate projections serve instead."""
        out_features = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        if self._qkv_bf16 is not None and self._qkv_bf16.serves(hidden):
            return self._qkv_bf16.linear(hidden)
        biases = [p.bias for p in (self.q_proj, self.k_proj, self.v_proj) if p.bias is not None]
        if self._qkv_quant is not None:
            return quant_linear(hidden, self._qkv_quant, torch.cat(biases) if biases else None)
        if self.q_proj.weight is None and self._packed is not None:  # released after packing
            packed, bias = self._packed
            return linear_released(hidden, packed, out_features, bias)
        if cpu_linear.supports(hidden, self.q_proj.weight, self.q_proj.bias):
            packed, bias = self.packed_qkv()
            return cpu_linear.linear_packed(hidden, packed, out_features, bias)
        return None

    def prepare_bf16(self, min_rows: int | None) -> int:
        """bf16 copies for many-row products: q, k and v stacked into one where they are
        fused (quantized or packed), else each projection's own (None: drop them); returns
        their bytes."""
        self._qkv_bf16 = None
        projections = (self.q_proj, self.k_proj, self.v_proj)
        total = self.o_proj.prepare_bf16(min_rows)
        weight = self.fused_qkv_weight() if min_rows is not None else None
        if weight is None or weight.device.type != "cpu":
            return total + sum(p.prepare_bf16(min_rows) for p in projections)
        biases = [p.bias for p in projections if p.bias is not None]
        self._qkv_bf16 = Bf16Weight.of(weight, torch.cat(biases) if biases else None, min_rows)
        return total + self._qkv_bf16.nbytes

    def fused_qkv_weight(self) -> torch.Tensor | None:
        """``[q; k; v]`` fp32 where the three are fused (quantized or packed), else None."""
        if self._qkv_quant is not None:
            return self._qkv_quant.dequantize()
        if self._packed is None:
            return None
        return unpanel(self._packed[0], (self.num_heads + 2 * self.num_kv_heads) * self.head_dim)

    def release_weights(self) -> None:
        if self._packed is not None:
            for p in (self.q_proj, self.k_proj, self.v_proj):
                p.weight = None
        self.o_proj.release_weight()

    def set_quantized(self, rows: dict[str, QuantRows]) -> None:
        """``rows``: this layer's quantized projections by name (q_proj, ...)."""
        qkv = [rows.get(n) for n in ("q_proj", "k_proj", "v_proj")]
        if all(r is not None for r in qkv) and len({r.fmt for r in qkv}) == 1:  # type: ignore[union-attr]
            self._qkv_quant = cpu_quant.pack(cpu_quant.cat_rows(qkv))  # type: ignore[arg-type]
            for p in (self.q_proj, self.k_proj, self.v_proj):
                p.set_quantized(None)
            rows = {n: r for n, r in rows.items() if n == "o_proj"}
        for name, r in rows.items():
            getattr(self, name).set_quantized(cpu_quant.pack(r))

    def prepare_packed(self) -> None:
        if packable(self.q_proj.weight) and packable(self.k_proj.weight) and packable(self.v_proj.weight):
            self.packed_qkv()
        self.o_proj.prepare_packed()

    def packed_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if any(p.weight is None for p in projections):
            return self._packed  # type: ignore[return-value]
        key = tuple(weight_key(p.weight) for p in projections) + tuple(
            weight_key(p.bias) for p in projections if p.bias is not None
        )
        if self._packed is None or self._packed_key != key:
            weight = torch.cat([p.weight.detach() for p in projections])
            biases = [p.bias.detach() for p in projections if p.bias is not None]
            self._packed = (cpu_linear.pack_weight(weight), torch.cat(biases) if biases else None)
            self._packed_key = key
        return self._packed
