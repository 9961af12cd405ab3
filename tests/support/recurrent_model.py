"""A tiny random hybrid model that keeps the recurrent-state contract, for the engine's
hybrid tests until the real Gated DeltaNet families are in.

Layers alternate: a recurrent mixer (a causal depthwise convolution, then a gated linear
recurrence over a ``[heads, dk, dv]`` matrix state) and full attention over the paged KV
pool (the engine's ``Attention``). The class declares only the attention layers in its
``KVSpec`` and the recurrent ones in ``recurrent_spec_for``.

``reference_generate`` is the check: a dense implementation on the same weights (whole
prompt at once, a plain list of keys and values, states carried in local tensors) that
never touches the engine's pool, slots or prefix cache.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from inference.kv.spec import KVSpec
from inference.kv.state_spec import RecurrentLayerSpec, RecurrentSpec
from inference.layers.attention_context import AttentionContext
from inference.layers.gqa_attention import Attention
from inference.layers.norm import RMSNorm
from inference.layers.rotary import apply_rotary, rope_cos_sin_cache
from inference.model_config import ModelConfig
from inference.models.registry import read_model_config
from inference.tokenizer import Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir, tiny_hf_config

CONV_K = 4
HEADS, DK = 2, 16
CHANNELS = 3 * HEADS * DK


def is_recurrent(layer: int) -> bool:
    return layer % 2 == 0


def scan(
    x: torch.Tensor, conv_w: torch.Tensor, decay: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [T, C]`` from the state ``(conv [C, K-1], ssm [H, dk, dv])``: the output
    ``[T, H*dv]`` and the states after the last token."""
    xs = torch.cat([conv, x.T], dim=1)  # [C, K-1+T]
    mixed = F.silu((xs.unfold(1, CONV_K, 1) * conv_w[:, None, :]).sum(-1).T)  # [T, C]
    q, k, v = mixed.view(len(x), 3, HEADS, DK).unbind(1)
    k = F.normalize(k, dim=-1)
    state = ssm.clone()
    outs = []
    for t in range(len(x)):
        state = decay[:, None, None] * state + k[t][:, :, None] * v[t][:, None, :]
        outs.append(torch.einsum("hd,hde->he", q[t], state))
    return torch.stack(outs).reshape(len(x), HEADS * DK), xs[:, -(CONV_K - 1) :].clone(), state


class RecurrentMixer(nn.Module):
    def __init__(self, hidden: int, index: int) -> None:
        super().__init__()
        self.index = index  # among the recurrent layers (the state pool's order)
        self.in_proj = nn.Linear(hidden, CHANNELS, bias=False)
        self.conv_w = nn.Parameter(torch.randn(CHANNELS, CONV_K) * 0.5)
        self.decay_logit = nn.Parameter(torch.randn(HEADS))
        self.out_proj = nn.Linear(HEADS * DK, hidden, bias=False)

    def forward(self, hidden: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        rec = ctx.recurrent
        assert rec is not None, "the engine gives a hybrid model its state slots"
        x = self.in_proj(hidden)
        decay = torch.sigmoid(self.decay_logit)
        starts = ctx.query_start_loc.tolist()
        slots = rec.state_slots.tolist()
        initial = rec.has_initial_state.tolist()
        conv_pool, ssm_pool = rec.states.conv[self.index], rec.states.ssm[self.index]
        out = torch.empty(len(x), HEADS * DK, dtype=x.dtype)
        for i, slot in enumerate(slots):
            a, b = starts[i], starts[i + 1]
            conv = conv_pool[slot] if initial[i] else torch.zeros_like(conv_pool[slot])
            ssm = ssm_pool[slot] if initial[i] else torch.zeros_like(ssm_pool[slot])
            out[a:b], new_conv, new_ssm = scan(x[a:b], self.conv_w, decay, conv, ssm)
            conv_pool[slot].copy_(new_conv)
            ssm_pool[slot].copy_(new_ssm)
        return self.out_proj(out)


class TinyHybridLM(nn.Module):
    supports_cuda_graphs = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norms = nn.ModuleList(
            RMSNorm(config.hidden_size, config.rms_norm_eps) for _ in range(config.num_layers)
        )
        mixers: list[nn.Module] = []
        for i in range(config.num_layers):
            if is_recurrent(i):
                mixers.append(RecurrentMixer(config.hidden_size, i // 2))
            else:
                mixers.append(Attention(config, i, (0, i // 2)))
        self.mixers = nn.ModuleList(mixers)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.cos_sin = rope_cos_sin_cache(config)

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(config.num_layers // 2, planes=2, token_shape=(config.num_kv_heads, config.head_dim))

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @classmethod
    def recurrent_spec_for(cls, config: ModelConfig) -> RecurrentSpec:
        layers = tuple(
            RecurrentLayerSpec(i, (CHANNELS, CONV_K - 1), (HEADS, DK, DK))
            for i in range(config.num_layers)
            if is_recurrent(i)
        )
        return RecurrentSpec(layers)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        cos_sin = self.cos_sin[positions]
        for norm, mixer in zip(self.norms, self.mixers, strict=True):
            if isinstance(mixer, RecurrentMixer):
                hidden = hidden + mixer(norm(hidden), ctx)
            else:
                hidden = hidden + mixer(norm(hidden), cos_sin, ctx, kv_cache)
        return self.final_norm(hidden)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def prepare_cpu_kernels(self) -> None:
        """Nothing packed: every product runs in PyTorch."""

    def load_weights(self, state_dict, device=None, dtype=None) -> None:
        raise NotImplementedError("built whole in the test, never from a checkpoint")

    # ---- the dense reference ----------------------------------------------------------
    @torch.inference_mode()
    def reference_generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens by a dense forward: whole prompt, then one token at a time."""
        cfg = self.config
        n_layers = cfg.num_layers
        states: list[tuple[torch.Tensor, torch.Tensor] | None] = [
            (torch.zeros(CHANNELS, CONV_K - 1), torch.zeros(HEADS, DK, DK)) if is_recurrent(i) else None
            for i in range(n_layers)
        ]
        keys: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        values: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        tokens = list(prompt)
        new_ids = list(prompt)
        out: list[int] = []
        while len(out) < max_tokens:
            start = len(tokens) - len(new_ids)
            positions = torch.arange(start, start + len(new_ids))
            hidden = self.embed(torch.tensor(new_ids))
            cos_sin = self.cos_sin[positions]
            half = cos_sin.shape[-1] // 2
            cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
            for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers, strict=True)):
                h = norm(hidden)
                if isinstance(mixer, RecurrentMixer):
                    conv, ssm = states[i]  # type: ignore[misc]
                    y, conv, ssm = scan(
                        mixer.in_proj(h), mixer.conv_w, torch.sigmoid(mixer.decay_logit), conv, ssm
                    )
                    states[i] = (conv, ssm)
                    hidden = hidden + mixer.out_proj(y)
                    continue
                t = len(new_ids)
                q = apply_rotary(mixer.q_proj(h).view(t, cfg.num_heads, cfg.head_dim), cos, sin)
                k = apply_rotary(mixer.k_proj(h).view(t, cfg.num_kv_heads, cfg.head_dim), cos, sin)
                v = mixer.v_proj(h).view(t, cfg.num_kv_heads, cfg.head_dim)
                keys[i].append(k)
                values[i].append(v)
                all_k = torch.cat(keys[i]).repeat_interleave(cfg.num_heads // cfg.num_kv_heads, dim=1)
                all_v = torch.cat(values[i]).repeat_interleave(cfg.num_heads // cfg.num_kv_heads, dim=1)
                mask = torch.ones(t, len(all_k), dtype=torch.bool).tril(len(all_k) - t)
                att = F.scaled_dot_product_attention(
                    q.transpose(0, 1), all_k.transpose(0, 1), all_v.transpose(0, 1), attn_mask=mask
                )
                hidden = hidden + mixer.o_proj(att.transpose(0, 1).reshape(t, -1))
            logits = self.compute_logits(self.final_norm(hidden[-1:]))
            token = int(logits.argmax(-1))
            out.append(token)
            tokens.append(token)
            new_ids = [token]
        return out


def tiny_hybrid_model(seed: int = 0, num_layers: int = 4) -> tuple[TinyHybridLM, Tokenizer, ModelConfig]:
    """``load_model``'s triple for a tiny random hybrid model over SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    hf_config = tiny_hf_config("llama", num_hidden_layers=num_layers, tie_word_embeddings=False)
    config = dataclasses.replace(read_model_config(hf_config), name="tiny-hybrid", eos_token_ids=[2])
    torch.manual_seed(seed)
    model = TinyHybridLM(config)
    for name, param in model.named_parameters():
        if name.endswith("weight") and param.dim() == 2:
            nn.init.normal_(param, std=0.2)
    model.eval()
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    return model, tokenizer, config
