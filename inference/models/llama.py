"""Llama-family decoder over a paged KV cache: Llama, Mistral and Qwen2, and the
families that differ from them by ModelConfig flags (Qwen3 and Qwen3-MoE, Phi-3,
OLMo 2, Granite, SmolLM3).

Parameter names match Hugging Face's ``*ForCausalLM`` exactly, so loading a
checkpoint is a straight ``state_dict`` copy. The forward pass works on packed
tokens ``[T]`` from many sequences at once; where each token's K/V goes and
what it attends to is described by the step's ``AttentionContext``.

The layers are in ``inference.layers``: their CPU weights' life (quantized blocks at
load, packed panels at engine start) in ``cpu_packing``, the one-call decode step's
layer description in ``cpu_decode_stack``, the kernels themselves in ``kernels/``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from chatsite_kernels.cpu.decode_stack import DecodeStack
from chatsite_kernels.cpu.quant import QuantRows
from chatsite_kernels.cpu.stack_adapters import AdapterStep
from inference.layers import cpu_packing
from inference.layers.attention_context import AttentionContext
from inference.layers.cpu_decode_stack import build_decode_stack
from inference.layers.embedding import Embedding
from inference.layers.fused_weights import split_fused_projections
from inference.layers.gqa_attention import Attention
from inference.layers.linear import Linear
from inference.layers.mlp import MLP
from inference.layers.moe import MoE, stack_expert_weights
from inference.layers.norm import RMSNorm
from inference.layers.rotary import longrope_rows, rope_cos_sin_cache
from inference.model_config import ModelConfig
from inference.models.decoder_base import KVHeadsDecoder, table_on


def _mlp(config: ModelConfig, layer_idx: int) -> nn.Module:
    """The layer's feed-forward block: a SwiGLU MLP, or routed experts (Qwen3-MoE)."""
    if config.moe is not None and config.moe.is_sparse(layer_idx):
        return MoE(config, config.moe)
    return MLP(config)


def _is_routing(name: str) -> bool:
    return ".mlp.gate." in name or ".mlp.experts." in name


class DecoderLayer(nn.Module):
    """Pre-norm: ``h += attn(norm(h)); h += mlp(norm(h))``, each block's output times
    ``residual_multiplier`` (Granite; 1 elsewhere) before the add."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        spec = LlamaForCausalLM.kv_spec_for(config)
        self.self_attn = Attention(config, layer_idx, spec.layer_slots[layer_idx])
        self.mlp = _mlp(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's residual form: takes the previous layer's MLP output and the running
        sum before it (None for the first layer), returns this layer's pair; the adds
        are fused into the norms. The same sums as ``h + attn(norm(h))`` and so on."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, ctx, kv_cache)
        if self.residual_multiplier != 1.0:
            hidden = hidden * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm.add_norm(hidden, residual)
        hidden = self.mlp(hidden)
        if self.residual_multiplier != 1.0:
            hidden = hidden * self.residual_multiplier
        return hidden, residual


class PostNormDecoderLayer(nn.Module):
    """OLMo 2: ``h += norm(attn(h)); h += norm(mlp(h))``, no norm of the blocks' inputs.
    Same residual form as ``DecoderLayer``: returns (the MLP's normed output, the sum
    before it), and the next layer (or the final norm) adds them."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = _mlp(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden if residual is None else residual + hidden
        residual = residual + self.post_attention_layernorm(self.self_attn(residual, cos_sin, ctx, kv_cache))
        return self.post_feedforward_layernorm(self.mlp(residual)), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        layer_class = PostNormDecoderLayer if config.post_norms else DecoderLayer
        self.layers = nn.ModuleList(layer_class(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(KVHeadsDecoder):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32.

    ``kv_cache`` is the engine's pool ``[num_blocks, 2, num_layers, block_size, Hkv, D]``
    (``kv_spec``: K and V per KV head).
    """

    decode_stack: DecodeStack | None = None  # set by prepare_cpu_kernels where it applies
    decode_adapters: AdapterStep | None = None  # the step's LoRA rows (inference.lora), while one runs

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self._attach_lm_head(Linear(config.hidden_size, config.vocab_size, bias=False))
        # Kept out of the module's buffers on purpose: `.to(bfloat16)` must not round
        # the angles, so the cache stays fp32 and follows the device lazily.
        self._cos_sin_cache = rope_cos_sin_cache(config)

    @property
    def supports_cuda_graphs(self) -> bool:
        """Routed experts count their tokens on the host (a sync a graph cannot capture);
        sliding layers take the Triton kernels' window parameter and read nothing there."""
        return self.config.moe is None

    @property
    def cos_sin_cache(self) -> torch.Tensor:
        """``[max_pos, rotary_dim]`` fp32 on the model's device (for the Triton rotary
        kernel); LongRoPE's short and long tables stacked (``rotary.longrope_rows``)."""
        self._cos_sin_cache = table_on(self._cos_sin_cache, self.model.norm.weight.device)
        return self._cos_sin_cache

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        config = self.config
        if config.rope_scaling is not None and config.rope_scaling["rope_type"] == "longrope":
            query_lens = ctx.query_start_loc.diff()
            ends = ctx.context_lens.repeat_interleave(query_lens, output_size=len(positions))
            cos_sin = self.cos_sin_cache[longrope_rows(config, positions, ends)]
        else:
            cos_sin = self.cos_sin_cache[positions.long()]
        hidden = self.model.embed_tokens(input_ids)
        if config.embedding_multiplier != 1.0:
            hidden = hidden * config.embedding_multiplier
        stack = self.decode_stack
        if (
            stack is not None
            and ctx.is_decode_only
            and cos_sin.device.type == "cpu"
            and len(ctx.context_lens) == len(hidden)
        ):
            # One C call for the whole stack: the per-op glue cost more than the kernels.
            return stack(
                hidden, cos_sin, ctx.slot_mapping, kv_cache, ctx.block_tables, ctx.context_lens,
                self.decode_adapters,
            )  # fmt: skip
        residual = None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, residual, cos_sin, ctx, kv_cache)
        if residual is None:  # a model without layers
            return self.model.norm(hidden)
        return self.model.norm.add_norm(hidden, residual)[0]

    def prepare_cpu_kernels(self) -> None:
        """Make the packed weight copies the CPU kernels read now (about 0.5 s for
        SmolLM2-135M) rather than in the first request's forward pass, then drop the
        fp32 originals they replace, so each weight is held once (a tied embedding then
        reads its rows from the LM head's panels). Nothing happens off the CPU, outside
        fp32, or when the kernels are unavailable; quantized weights were packed at load.

        The one-call decode stack is Llama's layer exactly; the other families keep the
        per-op path (each product still on the packed kernels)."""
        cpu_packing.pack_weights(self, release=True)
        # The one-call decode kernel is Llama's layer exactly and attends over whole
        # contexts: sliding layers keep their per-op path (``inference.layers.window_attention``).
        plain = self.config.is_plain_llama and self.config.layer_windows is None
        self.decode_stack = build_decode_stack(self) if plain else None

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        return logits.float()

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Install an HF-named state dict as our parameters, moved to ``device``/``dtype``.

        The tensors are assigned, not copied, so the model may be built on the meta
        device and never allocates twice (a same-dtype CPU load is zero-copy).
        ``lm_head.weight`` may be absent when embeddings are tied; rotary buffers that
        old checkpoints saved are ignored. Anything else missing or extra is an error."""
        params = dict(self.named_parameters())  # a tied lm_head is deduplicated away here
        state_dict = split_fused_projections(dict(state_dict), self.config)
        if self.config.moe is not None:
            # The router and the routed experts have no quantized kernel: GGUF blocks of
            # theirs are de-quantized (exactly) before the experts are stacked.
            state_dict = {
                name: t.dequantize() if isinstance(t, QuantRows) and _is_routing(name) else t
                for name, t in state_dict.items()
            }
            state_dict = stack_expert_weights(state_dict, self.config.num_layers, self.config.moe)
        quantized, plain = cpu_packing.split_quantized(state_dict, params, device, dtype)
        state_dict = {**plain, **{name: torch.empty(0, device="meta") for name in quantized}}
        missing = [name for name in params if name not in state_dict]
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        unexpected = [
            name
            for name in state_dict
            if name not in params and not name.endswith("rotary_emb.inv_freq") and name != "lm_head.weight"
        ]
        if unexpected:
            raise KeyError(f"checkpoint has weights this model lacks, e.g. {unexpected[:3]}")
        for name, param in params.items():
            tensor = state_dict[name]
            if name in quantized:
                continue
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
            tensor = tensor.to(device=device or param.device, dtype=dtype or param.dtype)
            module_name, _, attr = name.rpartition(".")
            setattr(self.get_submodule(module_name), attr, nn.Parameter(tensor, requires_grad=False))
        self._tie_lm_head()
        if quantized:
            cpu_packing.install_quantized(self, quantized)
            left = [n for n, p in self.named_parameters() if p.device.type == "meta"]
            if left:
                raise ValueError(f"quantized weights with no quantized path: {left[:3]}")
