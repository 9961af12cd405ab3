"""Llama-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

Parameter names match Hugging Face's ``*ForCausalLM`` exactly, so loading a
checkpoint is a straight ``state_dict`` copy. The forward pass works on packed
tokens ``[T]`` from many sequences at once; where each token's K/V goes and
what it attends to is described by the step's ``AttentionContext``.

The CPU linear layers are in inference/layers/linear.py, the one-call decode step's
layer description in llama_stack.py, the kernels themselves in kernels/.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from inference.kv.spec import KVSpec
from inference.layers.attention import paged_attention
from inference.layers.attention_context import AttentionContext
from inference.layers.linear import (
    Linear,
    gate_up_released,
    linear_released,
    packable,
    quant_linear,
    weight_key,
)
from inference.model_config import ModelConfig
from inference.models.llama_stack import build_decode_stack
from kernels.cpu import layer_ops as cpu_layer_ops
from kernels.cpu import linear as cpu_linear
from kernels.cpu import quant as cpu_quant
from kernels.cpu.decode_stack import DecodeStack
from kernels.cpu.quant import PackedQuant, QuantRows


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies ``[head_dim/2]`` (fp32), computed as transformers does for
    the default, ``linear`` and ``llama3`` rope types."""
    dim = config.head_dim
    # Explicit CPU: the model may be constructed under a `torch.device("meta")` context.
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling.get("original_max_position_embeddings", config.max_position_embeddings)
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between smoothly blended.
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    raise ValueError(f"rope type {rope_type!r}")  # ModelConfig.from_hf already rejects these


def rope_cos_sin_cache(config: ModelConfig) -> torch.Tensor:
    """``[max_position_embeddings, head_dim]`` fp32: cos in the first half, sin in the
    second (the layout ``kernels.reference.rotary_ref`` and the Triton kernel take)."""
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(positions, rope_inv_freq(config))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[T, heads, D]`` with ``cos``/``sin`` ``[T, 1, D/2]`` (fp32)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:
            if cpu_layer_ops.is_cpu_f32(x, self.weight) and cpu_layer_ops.available():
                return cpu_layer_ops.rms_norm(x, self.weight, self.eps)
            # One fused op, the same arithmetic as below when nothing is cast.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 and scale after casting back, as HF's LlamaRMSNorm does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``; on the CPU in fp32 one C call that
        adds into ``residual`` in place (the decoder's own running sum)."""
        if (
            cpu_layer_ops.is_cpu_f32(x, residual, self.weight)
            and residual.is_contiguous()
            and cpu_layer_ops.available()
        ):
            return cpu_layer_ops.rms_norm(x, self.weight, self.eps, residual=residual), residual
        residual = residual + x
        return self(residual), residual


class Attention(nn.Module):
    _packed: tuple[torch.Tensor, torch.Tensor | None] | None = None
    _packed_key: tuple[tuple[int, int], ...] | None = None
    _qkv_quant: PackedQuant | None = None  # q, k and v rows of one quantized format

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
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

    def forward(
        self, hidden: torch.Tensor, cos_sin: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """``cos_sin`` ``[T, D]``: each token's rotary cos (first half) and sin (second)."""
        tokens, d = hidden.shape[0], self.head_dim
        hq, hkv = self.num_heads, self.num_kv_heads
        k_cache, v_cache = kv_cache[:, 0, self.layer_idx], kv_cache[:, 1, self.layer_idx]
        qkv = self.fused_qkv(hidden)
        if qkv is not None and cpu_layer_ops.is_cpu_f32(kv_cache) and cpu_layer_ops.available():
            # Decode steps are dominated by per-op overhead at these sizes: one packed
            # q/k/v product, then one call rotates q and k in place and stores k and v.
            cpu_layer_ops.rotary_store(qkv, hq, hkv, cos_sin, ctx.slot_mapping, k_cache, v_cache)
            q = qkv[:, : hq * d].view(tokens, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
            out = paged_attention(q, k, v, k_cache, v_cache, ctx, self.scale, kv_stored=True)
        else:
            cos, sin = cos_sin[:, None, : d // 2], cos_sin[:, None, d // 2 :]  # broadcast over heads
            if qkv is not None:
                q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            else:
                q, k, v = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
            q = apply_rotary(q.reshape(tokens, hq, d), cos, sin)
            k = apply_rotary(k.reshape(tokens, hkv, d), cos, sin)
            out = paged_attention(q, k, v.reshape(tokens, hkv, d), k_cache, v_cache, ctx, self.scale)
        return self.o_proj(out.reshape(tokens, hq * d))

    def fused_qkv(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``[T, (Hq + 2 Hkv) D]`` from one product over the packed q/k/v weights, or
        None where the separate projections serve instead."""
        out_features = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
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


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). On the CPU in fp32 (without biases) gate,
    up and the SiLU product are one fused kernel call over interleaved packed weights."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple[tuple[int, int], tuple[int, int]] | None = None
    _gate_up_quant: PackedQuant | None = None  # gate and up rows interleaved 8 by 8

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        inter = intermediate_size or config.intermediate_size
        self.gate_proj = Linear(hidden, inter, bias=bias)
        self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj, self.up_proj
        if self._gate_up_quant is not None:
            hidden = quant_linear(x, self._gate_up_quant, None, silu_pairs=True)
        elif gate.weight is None and self._packed is not None:  # released after packing
            hidden = gate_up_released(x, self._packed, gate.out_features)
        elif gate.bias is None and up.bias is None and cpu_linear.supports(x, gate.weight, None):
            hidden = cpu_linear.gate_up_silu(x, self.packed_gate_up(), gate.out_features)
        else:
            hidden = F.silu(gate(x)) * up(x)
        return self.down_proj(hidden)

    def prepare_packed(self) -> None:
        gate, up = self.gate_proj, self.up_proj
        if gate.bias is None and up.bias is None and packable(gate.weight) and packable(up.weight):
            self.packed_gate_up()
        self.down_proj.prepare_packed()

    def release_weights(self) -> None:
        if self._packed is not None:
            self.gate_proj.weight = self.up_proj.weight = None
        self.down_proj.release_weight()

    def set_quantized(self, rows: dict[str, QuantRows]) -> None:
        gate, up = rows.get("gate_proj"), rows.get("up_proj")
        fusable = self.gate_proj.bias is None and self.up_proj.bias is None
        if gate is not None and up is not None and gate.fmt == up.fmt and gate.shape[0] % 8 == 0 and fusable:
            self._gate_up_quant = cpu_quant.pack(cpu_quant.interleave_gate_up(gate, up))
            self.gate_proj.set_quantized(None)
            self.up_proj.set_quantized(None)
            rows = {n: r for n, r in rows.items() if n == "down_proj"}
        for name, r in rows.items():
            getattr(self, name).set_quantized(cpu_quant.pack(r))

    def packed_gate_up(self) -> torch.Tensor:
        if self.gate_proj.weight is None or self.up_proj.weight is None:
            return self._packed  # type: ignore[return-value]
        key = (weight_key(self.gate_proj.weight), weight_key(self.up_proj.weight))
        if self._packed is None or self._packed_key != key:
            self._packed = cpu_linear.pack_gate_up(self.gate_proj.weight, self.up_proj.weight)
            self._packed_key = key
        return self._packed


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

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
        hidden, residual = self.post_attention_layernorm.add_norm(hidden, residual)
        return self.mlp(hidden), residual


class Embedding(nn.Embedding):
    """``nn.Embedding`` that can also look rows up in a quantized weight (``quant``) or
    in the fp32 panels of the tied LM head (``panels``) once its own weight is dropped;
    either way only the rows asked for are read."""

    quant: PackedQuant | None = None
    panels: torch.Tensor | None = None  # the tied LM head's packed weight [ceil(V / 16), H, 16]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return cpu_quant.embedding(ids, self.quant)
        if self.weight is None and self.panels is not None:
            flat = ids.reshape(-1).long()
            rows = self.panels[flat // cpu_linear.PANEL, :, flat % cpu_linear.PANEL]
            return rows.view(*ids.shape, self.embedding_dim)
        return super().forward(ids)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids[T], positions[T], ctx, kv_cache) -> hidden[T, H]``;
    ``compute_logits(hidden[N, H]) -> [N, vocab]`` fp32.

    ``kv_cache`` is the engine's pool ``[num_blocks, 2, num_layers, block_size, Hkv, D]``
    (``kv_spec``: K and V per KV head).
    """

    decode_stack: DecodeStack | None = None  # set by prepare_cpu_kernels where it applies

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(config.num_layers, planes=2, token_shape=(config.num_kv_heads, config.head_dim))

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Kept out of the module's buffers on purpose: `.to(bfloat16)` must not round
        # the angles, so the cache stays fp32 and follows the device lazily.
        self._cos_sin_cache = rope_cos_sin_cache(config)

    @property
    def cos_sin_cache(self) -> torch.Tensor:
        """``[max_pos, head_dim]`` fp32 on the model's device (for the Triton rotary kernel)."""
        device = self.model.norm.weight.device
        if self._cos_sin_cache.device != device:
            self._cos_sin_cache = self._cos_sin_cache.to(device)
        return self._cos_sin_cache

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        cos_sin = self.cos_sin_cache[positions.long()]
        hidden = self.model.embed_tokens(input_ids)
        stack = self.decode_stack
        if (
            stack is not None
            and ctx.is_decode_only
            and cos_sin.device.type == "cpu"
            and len(ctx.context_lens) == len(hidden)
        ):
            # One C call for the whole stack: the per-op glue cost more than the kernels.
            return stack(hidden, cos_sin, ctx.slot_mapping, kv_cache, ctx.block_tables, ctx.context_lens)
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
        fp32, or when the kernels are unavailable; quantized weights were packed at load."""
        for layer in self.model.layers:
            layer.self_attn.prepare_packed()
            layer.mlp.prepare_packed()
            layer.self_attn.release_weights()
            layer.mlp.release_weights()
        self.lm_head.prepare_packed()
        embed = self.model.embed_tokens
        if (
            self.config.tie_word_embeddings
            and self.lm_head.quant is None
            and self.lm_head._packed is not None
        ):
            embed.panels, embed.weight = self.lm_head.packed_weight(), None
        self.lm_head.release_weight()
        self.decode_stack = build_decode_stack(self)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

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
        quantize = (
            (device is None or torch.device(device).type == "cpu")
            and dtype in (None, torch.float32)
            and cpu_quant.available()
        )
        quantized: dict[str, QuantRows] = {}
        plain: dict[str, torch.Tensor] = {}
        for name, tensor in state_dict.items():
            if isinstance(tensor, QuantRows) and quantize and (name in params or name == "lm_head.weight"):
                quantized[name] = tensor
            elif isinstance(tensor, QuantRows):  # no quantized kernel here: de-quantize (exact)
                plain[name] = tensor.dequantize()
            else:
                plain[name] = tensor
        for name, rows in quantized.items():
            expected = params["model.embed_tokens.weight" if name == "lm_head.weight" else name].shape
            if rows.shape != tuple(expected):
                raise ValueError(f"{name}: checkpoint shape {rows.shape} != {tuple(expected)}")
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
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if quantized:
            self._install_quantized(quantized)
            left = [n for n, p in self.named_parameters() if p.device.type == "meta"]
            if left:
                raise ValueError(f"quantized weights with no quantized path: {left[:3]}")

    def _install_quantized(self, rows: dict[str, QuantRows]) -> None:
        """Pack the quantized weights (fusing q/k/v and gate/up where their formats
        match) and drop the fp32 parameters they replace."""
        for i, layer in enumerate(self.model.layers):
            for part in ("self_attn", "mlp"):
                prefix = f"model.layers.{i}.{part}."
                mine = {n[len(prefix) : -len(".weight")]: r for n, r in rows.items() if n.startswith(prefix)}
                if mine:
                    getattr(layer, part).set_quantized(mine)
        embed = rows.get("model.embed_tokens.weight")
        if embed is not None:
            packed = cpu_quant.pack(embed)
            self.model.embed_tokens.quant, self.model.embed_tokens.weight = packed, None
            if self.config.tie_word_embeddings:
                self.lm_head.set_quantized(packed)  # one copy serves both
        if "lm_head.weight" in rows and not self.config.tie_word_embeddings:
            self.lm_head.set_quantized(cpu_quant.pack(rows["lm_head.weight"]))
