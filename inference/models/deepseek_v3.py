"""DeepSeek-V3 decoder over a paged *latent* KV cache: multi-head latent attention
(``inference.layers.mla_attention``) and a mixture of experts (``inference.layers.moe``).

Parameter names match Hugging Face's ``DeepseekV3ForCausalLM`` checkpoints, except
that the routed experts' per-expert weights are stacked at load time. The forward
signature is the Llama decoder's: packed tokens ``[T]`` of many sequences, their
positions, the step's ``AttentionContext`` and the engine's pool.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from inference.errors import UnsupportedModelError
from inference.kv.spec import KVSpec
from inference.layers.attention_context import AttentionContext
from inference.layers.mla_attention import mla_attention
from inference.layers.moe import MoE
from inference.model_config import MLAConfig, ModelConfig
from inference.models.llama import MLP, Linear, RMSNorm, apply_rotary

# DeepSeek's q_a/kv_a norms use RMSNorm's default epsilon, not config.rms_norm_eps.
_LORA_NORM_EPS = 1e-6


def _mla(config: ModelConfig) -> MLAConfig:
    if config.mla is None:
        raise UnsupportedModelError(config.architecture, "DeepSeek-V3 needs an MLA config")
    return config.mla


def yarn_inv_freq(theta: float, dim: int, scaling: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN's blended inverse frequencies and its cos/sin factor, as transformers
    computes them (``_compute_yarn_parameters``)."""
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_positions
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    ramp = ((torch.arange(dim // 2, device="cpu", dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # high frequencies keep their original speed
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def rope_cos_sin(config: ModelConfig) -> torch.Tensor:
    """``[max_positions, rope_dim]`` fp32: cos (times YaRN's factor) then sin."""
    dim = _mla(config).qk_rope_head_dim
    if config.rope_scaling is None:
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim))
        factor = 1.0
    else:
        inv_freq, factor = yarn_inv_freq(
            config.rope_theta, dim, config.rope_scaling, config.max_position_embeddings
        )
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(positions, inv_freq)
    return torch.cat((freqs.cos() * factor, freqs.sin() * factor), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """RoPE of ``x`` ``[T, heads, D]``. Interleaved (DeepSeek): pairs (x0, x1), (x2, x3)...
    rotate together; the result is laid out as rotated evens then odds, exactly as
    transformers does it (queries and keys alike, so their dot products are those of
    the interleaved rotation)."""
    if not interleaved:
        return apply_rotary(x, cos, sin)
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class MLAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        mla = self.mla = _mla(config)
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = self.num_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, q_out, bias=False)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, _LORA_NORM_EPS)
            self.q_b_proj = Linear(mla.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, _LORA_NORM_EPS)
        self.kv_b_proj = Linear(
            mla.kv_lora_rank, self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False
        )
        self.o_proj = Linear(self.num_heads * mla.v_head_dim, hidden, bias=bias)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        mla, tokens, heads = self.mla, hidden.shape[0], self.num_heads
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(tokens, heads, -1).split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(hidden).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        q_pe = rotate(q_pe, cos, sin, mla.rope_interleave)
        k_pe = rotate(k_pe[:, None], cos, sin, mla.rope_interleave)[:, 0]
        latent = torch.cat((self.kv_a_layernorm(c_kv.contiguous()), k_pe), dim=-1)
        w_kv_b = self.kv_b_proj.weight.view(heads, -1, mla.kv_lora_rank)
        out = mla_attention(
            q_nope, q_pe, latent, kv_cache[:, 0, self.layer_idx], ctx, w_kv_b, mla.softmax_scale
        )
        return self.o_proj(out.reshape(tokens, heads * mla.v_head_dim))

    def prepare_packed(self) -> None:
        for name in ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
            proj = getattr(self, name, None)
            if proj is not None:
                proj.prepare_packed()


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        moe = config.moe
        self.self_attn = MLAttention(config, layer_idx)
        dense = moe is None or layer_idx < moe.first_dense_layers
        self.mlp: nn.Module = MLP(config) if dense else MoE(config, moe)  # type: ignore[arg-type]
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Llama decoder's residual form (adds fused into the norms)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, ctx, kv_cache)
        hidden, residual = self.post_attention_layernorm.add_norm(hidden, residual)
        return self.mlp(hidden), residual


class DeepseekV3Model(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3ForCausalLM(nn.Module):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32.

    ``kv_cache`` is the engine's pool ``[num_blocks, 1, num_layers, block_size, r + rope]``
    (``kv_spec``: one latent per token and layer)."""

    # The latent store computes its slots on the host (AttentionContext.store_index),
    # which a CUDA graph cannot capture; decode steps run eagerly.
    supports_cuda_graphs = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DeepseekV3Model(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._cos_sin = rope_cos_sin(config)  # fp32, outside the buffers: see LlamaForCausalLM

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(config.num_layers, planes=1, token_shape=(_mla(config).latent_dim,))

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        device = self.model.embed_tokens.weight.device
        if self._cos_sin.device != device:
            self._cos_sin = self._cos_sin.to(device)
        cos_sin = self._cos_sin[positions.long()]
        half = cos_sin.shape[-1] // 2
        cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # broadcast over heads
        hidden = self.model.embed_tokens(input_ids)
        residual = None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, residual, cos, sin, ctx, kv_cache)
        if residual is None:
            return self.model.norm(hidden)
        return self.model.norm.add_norm(hidden, residual)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def prepare_cpu_kernels(self) -> None:
        """Packed copies of the dense projections for the CPU GEMM (see LlamaForCausalLM)."""
        for layer in self.model.layers:
            layer.self_attn.prepare_packed()
            layer.mlp.prepare_packed()
        self.lm_head.prepare_packed()

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Install an HF-named state dict (see ``LlamaForCausalLM.load_weights``).

        Per-expert weights are stacked into ``experts.gate_up_proj`` / ``down_proj``;
        the multi-token-prediction layers past ``num_hidden_layers`` (DeepSeek's MTP
        module, unused for plain decoding) are skipped; the router stays fp32, as in
        the reference implementation."""
        weights = _stack_experts(dict(state_dict), self.config)
        params = dict(self.named_parameters())
        missing = [name for name in params if name not in weights]
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        extra_layer = re.compile(r"model\.layers\.(\d+)\.")
        unexpected = []
        for name in weights:
            match = extra_layer.match(name)
            beyond = match is not None and int(match.group(1)) >= self.config.num_layers
            if name not in params and not beyond and not name.endswith("rotary_emb.inv_freq"):
                if name != "lm_head.weight":
                    unexpected.append(name)
        if unexpected:
            raise KeyError(f"checkpoint has weights this model lacks, e.g. {unexpected[:3]}")
        for name, param in params.items():
            tensor = weights[name]
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
            router = ".mlp.gate." in name
            tensor = tensor.to(
                device=device or param.device, dtype=torch.float32 if router else dtype or param.dtype
            )
            module_name, _, attr = name.rpartition(".")
            setattr(self.get_submodule(module_name), attr, nn.Parameter(tensor, requires_grad=False))
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


def _stack_experts(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF's ``mlp.experts.{e}.{gate,up,down}_proj.weight`` -> our stacked tensors."""
    moe = config.moe
    if moe is None:
        return weights
    for layer in range(moe.first_dense_layers, config.num_layers):
        prefix = f"model.layers.{layer}.mlp.experts."
        if f"{prefix}gate_up_proj" in weights:
            continue  # already stacked (our own or transformers' fused layout)
        try:
            gate_up = [
                torch.cat(
                    (weights.pop(f"{prefix}{e}.gate_proj.weight"), weights.pop(f"{prefix}{e}.up_proj.weight"))
                )
                for e in range(moe.num_experts)
            ]
            down = [weights.pop(f"{prefix}{e}.down_proj.weight") for e in range(moe.num_experts)]
        except KeyError as exc:
            raise KeyError(f"checkpoint lacks expert weight {exc.args[0]}") from None
        weights[f"{prefix}gate_up_proj"] = torch.stack(gate_up)
        weights[f"{prefix}down_proj"] = torch.stack(down)
    return weights
