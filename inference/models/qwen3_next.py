"""Hybrid linear-attention decoders: Qwen3-Next and Qwen3.5 (text).

Every layer is pre-norm, ``h += mixer(norm(h)); h += mlp(norm(h))``, with (1 + w)
RMSNorms, and its mixer is one of:

- a Gated DeltaNet (``inference.layers.gated_deltanet``), three layers in four: a
  recurrent layer whose per-sequence state lives in the engine's state pool
  (``recurrent_spec``), not in the KV cache;
- gated full attention: ``q_proj`` gives each head's query and an output gate, q and k
  get a per-head (1 + w) RMSNorm, the first ``rotary_dim`` features rotate, and the
  attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``. Only these
  layers are in the paged KV pool (``kv_spec``).

Qwen3-Next's MLP is routed experts plus a shared expert scaled by a sigmoid gate;
Qwen3.5's is a dense SwiGLU. Parameter names are Hugging Face's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from inference.kv.spec import KVSpec
from inference.kv.state_spec import RecurrentLayerSpec, RecurrentSpec
from inference.layers.attention import paged_attention
from inference.layers.attention_context import AttentionContext
from inference.layers.gated_deltanet import GatedDeltaNet, linear_attention_config
from inference.layers.linear import Linear
from inference.layers.mlp import MLP
from inference.layers.moe import RoutedExperts, SoftmaxTopkRouter, stack_expert_weights
from inference.layers.norm import ZeroCenteredRMSNorm
from inference.layers.rotary import apply_rotary, rope_cos_sin_cache
from inference.model_config import ModelConfig
from inference.models.decoder_base import run_layers, table_on
from inference.models.weights import assign_weights

_TEXT_PREFIX = re.compile(r"^model\.language_model\.")


class GatedAttention(nn.Module):
    def __init__(self, config: ModelConfig, kv_slot: int) -> None:
        super().__init__()
        self.kv_slot = kv_slot
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, 2 * q_size, bias=bias)  # each head: query, then gate
        self.k_proj = Linear(config.hidden_size, kv_size, bias=bias)
        self.v_proj = Linear(config.hidden_size, kv_size, bias=bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = self.head_dim**-0.5

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        tokens, d = hidden.shape[0], self.head_dim
        q, gate = self.q_proj(hidden).view(tokens, self.num_heads, 2 * d).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(hidden).view(tokens, self.num_kv_heads, d))
        v = self.v_proj(hidden).view(tokens, self.num_kv_heads, d)
        half = cos_sin.shape[-1] // 2  # half the rotary features (the first part of each head)
        cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache[:, 0, self.kv_slot], kv_cache[:, 1, self.kv_slot]
        out = paged_attention(q.contiguous(), k.contiguous(), v, k_cache, v_cache, ctx, self.scale)
        out = out.reshape(tokens, self.num_heads * d) * torch.sigmoid(gate.reshape(tokens, -1))
        return self.o_proj(out)


class SharedExpertMoE(nn.Module):
    """Routed experts (softmax router, top-k) plus ``sigmoid(shared_expert_gate(x)) *
    shared_expert(x)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.moe is not None
        shared = linear_attention_config(config).shared_expert_intermediate_size
        self.gate = SoftmaxTopkRouter(config, config.moe)
        self.experts = RoutedExperts(config.hidden_size, config.moe)
        self.shared_expert = MLP(config, intermediate_size=shared)
        self.shared_expert_gate = Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(hidden)
        routed = self.experts(hidden, weights, ids)
        return routed + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, mixer_index: int) -> None:
        """``mixer_index``: the layer's place among the recurrent layers (a linear layer)
        or among the KV pool's layers (a full-attention layer)."""
        super().__init__()
        self.is_linear = linear_attention_config(config).layer_types[layer_idx] == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, mixer_index)
        else:
            self.self_attn = GatedAttention(config, mixer_index)
        moe = config.moe
        self.mlp: nn.Module = (
            SharedExpertMoE(config) if moe is not None and moe.is_sparse(layer_idx) else MLP(config)
        )
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        if self.is_linear:
            mixed = self.linear_attn(normed, ctx)
        else:
            mixed = self.self_attn(normed, cos_sin, ctx, kv_cache)
        hidden = hidden + mixed
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class HybridModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        la = linear_attention_config(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        linear, full = la.linear_layers, la.full_layers
        self.layers = nn.ModuleList(
            HybridDecoderLayer(config, i, linear.index(i) if i in linear else full.index(i))
            for i in range(config.num_layers)
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3NextForCausalLM(nn.Module):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]`` with
    ``ctx.recurrent`` set (the state slots of the step's sequences);
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32. Serves Qwen3.5 too."""

    # The delta rule and the convolution read each sequence's span on the host.
    supports_cuda_graphs = False

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        """The full-attention layers only: decoder layer ``full_layers[j]`` is KV layer ``j``."""
        full = linear_attention_config(config).full_layers
        return KVSpec(len(full), planes=2, token_shape=(config.num_kv_heads, config.head_dim))

    @classmethod
    def recurrent_spec_for(cls, config: ModelConfig) -> RecurrentSpec:
        """One entry per Gated DeltaNet layer: the convolution's last ``K-1`` inputs of its
        ``conv_dim`` channels, and the ``[Hv, Dk, Dv]`` delta-rule matrix."""
        la = linear_attention_config(config)
        return RecurrentSpec(
            tuple(
                RecurrentLayerSpec(
                    layer=i,
                    conv_shape=(la.conv_dim, la.conv_kernel - 1),
                    ssm_shape=(la.num_v_heads, la.head_k_dim, la.head_v_dim),
                )
                for i in la.linear_layers
            )
        )

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @property
    def recurrent_spec(self) -> RecurrentSpec:
        return self.recurrent_spec_for(self.config)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = HybridModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # fp32 angles kept out of the buffers (``.to(bfloat16)`` must not round them).
        self._cos_sin = rope_cos_sin_cache(config)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        self._cos_sin = table_on(self._cos_sin, positions.device)
        return run_layers(self.model, self._cos_sin[positions.long()], input_ids, ctx, kv_cache)

    def prepare_cpu_kernels(self) -> None:
        """Nothing to pack ahead: the projections pack their CPU panels on first use."""

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """HF's names; the multi-token-prediction head (``mtp.*``) is left out on purpose:
        the engine does not draft with it. A vision-language checkpoint's text model
        (``model.language_model.*``) is served without its vision tower (``model.visual.*``).
        Per-expert weights are stacked."""
        weights = {
            _TEXT_PREFIX.sub("model.", name): t
            for name, t in state_dict.items()
            if not name.startswith(("mtp.", "model.visual."))
        }
        if self.config.moe is not None:
            weights = stack_expert_weights(weights, self.config.num_layers, self.config.moe)
        assign_weights(self, weights, device, dtype, optional=("lm_head.weight",))
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        elif "lm_head.weight" not in weights:
            raise KeyError("checkpoint lacks lm_head.weight (and the embeddings are not tied)")
