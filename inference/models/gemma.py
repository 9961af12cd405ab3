"""Gemma 2 and Gemma 3 (text) over the paged KV cache.

What differs from the Llama decoder (``inference.models.llama``):

- RMSNorm scales by ``1 + w`` (the weights are stored centred on zero), in fp32;
- four norms per layer: before and after attention, before and after the MLP, each
  "after" norm applied to the branch's output before the residual add;
- embeddings are multiplied by ``sqrt(hidden_size)`` (in the weights' dtype, as HF);
- attention scores are scaled by ``query_pre_attn_scalar ** -0.5``; Gemma 3 normalises
  each head's q and k (the same ``1 + w`` norm) before rotary; Gemma 2 soft-caps scores;
- sliding layers (``layer_types``) attend within ``sliding_window`` and, in Gemma 3,
  rotate with their own base (``rope_local_base_freq``), the full layers with ``rope_theta``
  (and its scaling);
- the MLP is GELU (tanh approximation) gated; logits may be soft-capped.

The KV pool has one group per window class (``KVSpec.groups``): the sliding layers'
blocks leave the pool as the window moves on (``inference.kv.block_manager``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from inference.kv.spec import KVSpec
from inference.layers.attention import paged_attention
from inference.layers.attention_context import AttentionContext
from inference.layers.norm import ZeroCenteredRMSNorm as GemmaRMSNorm
from inference.layers.rotary import apply_rotary, rope_cos_sin_cache
from inference.layers.window_attention import AttentionFeatures, feature_attention
from inference.model_config import GemmaConfig, ModelConfig
from inference.models.decoder_base import KVHeadsDecoder, table_on
from inference.models.weights import assign_weights


def _gemma(config: ModelConfig) -> GemmaConfig:
    assert config.gemma is not None, "a Gemma model needs ModelConfig.gemma"
    return config.gemma


class GemmaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, kv_slot: tuple[int, int]) -> None:
        super().__init__()
        gemma = _gemma(config)
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.kv_group, self.kv_slot = kv_slot
        self.is_sliding = (config.layer_windows or (None,) * config.num_layers)[layer_idx] is not None
        self.scale = gemma.query_pre_attn_scalar**-0.5
        self.features = AttentionFeatures(
            window=config.sliding_window if self.is_sliding else None, softcap=gemma.attn_softcap
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=bias)
        if gemma.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        tokens, d = hidden.shape[0], self.head_dim
        q = self.q_proj(hidden).view(tokens, self.num_heads, d)
        k = self.k_proj(hidden).view(tokens, self.num_kv_heads, d)
        v = self.v_proj(hidden).view(tokens, self.num_kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos_sin[:, None, : d // 2], cos_sin[:, None, d // 2 :]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache[:, 0, self.kv_slot], kv_cache[:, 1, self.kv_slot]
        ctx = ctx.for_group(self.kv_group)
        if self.features.plain:
            out = paged_attention(q, k, v, k_cache, v_cache, ctx, self.scale)
        else:
            out = feature_attention(q, k, v, k_cache, v_cache, ctx, self.scale, self.features)
        return self.o_proj(out.reshape(tokens, self.num_heads * d))


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, kv_slot: tuple[int, int]) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = GemmaAttention(config, layer_idx, kv_slot)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), cos_sin, ctx, kv_cache)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


class GemmaModel(nn.Module):
    def __init__(self, config: ModelConfig, spec: KVSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, i, spec.layer_slots[i]) for i in range(config.num_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class GemmaForCausalLM(KVHeadsDecoder):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32 (soft-capped where configured)."""

    # Sliding layers and soft-capped scores take the Triton kernels' window and soft-cap
    # parameters on CUDA: nothing reads the host, so decode steps are captured.
    supports_cuda_graphs = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GemmaModel(config, self.kv_spec)
        self._attach_lm_head(nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        local = dataclasses.replace(config, rope_theta=_gemma(config).local_rope_theta, rope_scaling=None)
        # fp32 tables kept out of the buffers (``.to(bfloat16)`` must not round the angles).
        self._cos_sin = {False: rope_cos_sin_cache(config), True: rope_cos_sin_cache(local)}

    def _cos_sin_for(self, sliding: bool, positions: torch.Tensor) -> torch.Tensor:
        table = self._cos_sin[sliding] = table_on(self._cos_sin[sliding], positions.device)
        return table[positions]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        positions = positions.long()
        cos_sin = {sliding: self._cos_sin_for(sliding, positions) for sliding in (False, True)}
        embed = self.model.embed_tokens
        hidden = embed(input_ids) * torch.tensor(self.config.hidden_size**0.5, dtype=embed.weight.dtype)
        for layer in self.model.layers:
            hidden = layer(hidden, cos_sin[layer.self_attn.is_sliding], ctx, kv_cache)
        return self.model.norm(hidden)

    def prepare_cpu_kernels(self) -> None:
        """Nothing to pack: the products run on PyTorch's own CPU kernels."""

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = _gemma(self.config).final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        assign_weights(self, state_dict, device, dtype, optional=("lm_head.weight",))
        self._tie_or_require_lm_head(state_dict)
