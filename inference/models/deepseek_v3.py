"""DeepSeek-V3 decoder over a paged *latent* KV cache: multi-head latent attention
(``inference.layers.mla_attention``) and a mixture of experts (``inference.layers.moe``).

Parameter names match Hugging Face's ``DeepseekV3ForCausalLM`` checkpoints, except
that the routed experts' per-expert weights are stacked at load time. The forward
signature is the Llama decoder's: packed tokens ``[T]`` of many sequences, their
positions, the step's ``AttentionContext`` and the engine's pool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from inference.errors import UnsupportedModelError
from inference.kv.spec import KVSpec
from inference.kv.state_spec import RecurrentSpec
from inference.layers import cpu_packing
from inference.layers.attention_context import AttentionContext
from inference.layers.linear import Linear
from inference.layers.mla_attention import MLAttention
from inference.layers.mlp import MLP
from inference.layers.moe import MoE, stack_expert_weights
from inference.layers.norm import RMSNorm
from inference.layers.rotary import yarn_cos_sin_cache
from inference.model_config import MLAConfig, ModelConfig


def _mla(config: ModelConfig) -> MLAConfig:
    if config.mla is None:
        raise UnsupportedModelError(config.architecture, "DeepSeek-V3 needs an MLA config")
    return config.mla


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        moe = config.moe
        self.self_attn = MLAttention(config, _mla(config), layer_idx)
        dense = moe is None or not moe.is_sparse(layer_idx)
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
        # fp32, outside the buffers: see LlamaForCausalLM
        self._cos_sin = yarn_cos_sin_cache(config, _mla(config).qk_rope_head_dim)

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(config.num_layers, planes=1, token_shape=(_mla(config).latent_dim,))

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @classmethod
    def recurrent_spec_for(cls, config: ModelConfig) -> RecurrentSpec | None:
        """No recurrent layers: every layer attends over the paged KV pool."""
        return None

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
        cpu_packing.pack_weights(self)

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
        moe = self.config.moe
        weights = dict(state_dict)
        if moe is not None:
            weights = stack_expert_weights(weights, self.config.num_layers, moe)
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
