"""gpt-oss over the paged KV cache.

- Attention: biases on q/k/v/o, YaRN rotary (``inference.layers.rotary``), and a learned
  sink logit per head that joins each softmax's denominator (it takes probability mass
  and returns nothing). Layers alternate sliding (``sliding_window``) and full attention
  (``layer_types``); both go through ``inference.layers.window_attention`` (the C decode
  kernel and the Triton kernels take the sinks and window), and the sliding ones' blocks leave the pool as the window
  moves on (``KVSpec.groups``).
- MLP: a router (linear with bias) picks the top-k experts per token and weighs them by
  a softmax over their logits; each expert is ``down((up + 1) * gate * sigmoid(alpha *
  gate))`` with ``gate`` clamped above and ``up`` clamped both ways at ``limit``, gate and
  up interleaved in one ``gate_up_proj`` (HF's layout: ``[E, H, 2I]``, biases ``[E, 2I]``).
- Checkpoints' MXFP4 experts (``*_blocks``/``*_scales``) are de-quantized at load
  (``inference.runner.mxfp4``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from inference.kv.spec import KVSpec
from inference.layers.attention_context import AttentionContext
from inference.layers.norm import RMSNorm
from inference.layers.rotary import apply_rotary, yarn_cos_sin_cache
from inference.layers.window_attention import AttentionFeatures, feature_attention
from inference.model_config import GptOssConfig, ModelConfig
from inference.models.decoder_base import KVHeadsDecoder, run_layers, table_on
from inference.models.weights import assign_weights
from inference.runner.mxfp4 import dequantize_blocks


def _opts(config: ModelConfig) -> GptOssConfig:
    assert config.gpt_oss is not None, "a gpt-oss model needs ModelConfig.gpt_oss"
    return config.gpt_oss


class GptOssAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, kv_slot: tuple[int, int]) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.kv_group, self.kv_slot = kv_slot
        self.window = (config.layer_windows or (None,) * config.num_layers)[layer_idx]
        self.scale = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias, out_bias = config.attention_bias, config.attention_out_bias
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=out_bias)
        self.sinks = nn.Parameter(torch.zeros(self.num_heads))

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        tokens, d = hidden.shape[0], self.head_dim
        q = self.q_proj(hidden).view(tokens, self.num_heads, d)
        k = self.k_proj(hidden).view(tokens, self.num_kv_heads, d)
        v = self.v_proj(hidden).view(tokens, self.num_kv_heads, d)
        cos, sin = cos_sin[:, None, : d // 2], cos_sin[:, None, d // 2 :]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache[:, 0, self.kv_slot], kv_cache[:, 1, self.kv_slot]
        features = AttentionFeatures(window=self.window, sinks=self.sinks)
        out = feature_attention(q, k, v, k_cache, v_cache, ctx.for_group(self.kv_group), self.scale, features)
        return self.o_proj(out.reshape(tokens, self.num_heads * d))


class GptOssRouter(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        opts = _opts(config)
        self.top_k = opts.top_k
        self.weight = nn.Parameter(torch.zeros(opts.num_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(opts.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights ``[T, k]``, expert ids ``[T, k]``)."""
        logits = F.linear(x, self.weight, self.bias)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return top.softmax(dim=-1), ids


class GptOssExperts(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        opts = _opts(config)
        e, h, i = opts.num_experts, config.hidden_size, config.intermediate_size
        self.alpha, self.limit = opts.swiglu_alpha, opts.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * i))
        self.down_proj = nn.Parameter(torch.zeros(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.zeros(e, h))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        # One product per expert over the tokens routed to it (few tokens, many experts).
        for expert in ids.unique().tolist():
            token, slot = torch.where(ids == expert)
            gate_up = x[token] @ self.gate_up_proj[expert] + self.gate_up_proj_bias[expert]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            act = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
            y = act @ self.down_proj[expert] + self.down_proj_bias[expert]
            out.index_add_(0, token, (y * weights[token, slot, None]).to(x.dtype))
        return out


class GptOssMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.router = GptOssRouter(config)
        self.experts = GptOssExperts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(x)
        return self.experts(x, weights, ids)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, kv_slot: tuple[int, int]) -> None:
        super().__init__()
        self.self_attn = GptOssAttention(config, layer_idx, kv_slot)
        self.mlp = GptOssMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos_sin, ctx, kv_cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class GptOssModel(nn.Module):
    def __init__(self, config: ModelConfig, spec: KVSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            GptOssDecoderLayer(config, i, spec.layer_slots[i]) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class GptOssForCausalLM(KVHeadsDecoder):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32."""

    # Its experts find their tokens on the host (``GptOssExperts.forward``).
    supports_cuda_graphs = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GptOssModel(config, self.kv_spec)
        self._attach_lm_head(nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self._cos_sin = yarn_cos_sin_cache(config, config.head_dim)  # fp32, YaRN's factor applied

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
        """Nothing to pack: the products run on PyTorch's own CPU kernels."""

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        state_dict = dequantize_experts(state_dict)
        assign_weights(self, state_dict, device, dtype, optional=("lm_head.weight",))
        self._tie_or_require_lm_head(state_dict)


def dequantize_experts(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace each MXFP4 expert weight (``<name>_blocks`` ``[E, out, G, 16]`` with
    ``<name>_scales`` ``[E, out, G]``) by the fp32 tensor HF's model holds: ``[E, in, out]``."""
    out = {k: v for k, v in state_dict.items() if not k.endswith(("_blocks", "_scales"))}
    for key in state_dict:
        if not key.endswith("_blocks"):
            continue
        name = key.removesuffix("_blocks")
        scales = state_dict.get(name + "_scales")
        if scales is None:
            raise KeyError(f"{key} has no {name}_scales")
        out[name] = dequantize_blocks(state_dict[key], scales).transpose(-1, -2).contiguous()
    return out
