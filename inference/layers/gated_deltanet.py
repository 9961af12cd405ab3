"""Gated DeltaNet: the linear-attention layer of the hybrid Qwen models (Qwen3-Next,
Qwen3.5), over the engine's recurrent state pool (``AttentionContext.recurrent``).

Per token: project to q, k, v (through a short causal convolution with SiLU), the
output gate ``z``, and per value head ``beta = sigmoid(b)`` and the log decay
``g = -exp(A_log) * softplus(a + dt_bias)``; L2-normalise q and k; run the gated delta
rule (``delta_rule``: a C or Triton kernel, or the PyTorch reference) from the
sequence's saved state; then
``out_proj(GatedRMSNorm(out, z))``. The convolution's last inputs and the rule's matrix
are the sequence's state, read from and written back to its slot.
"""

from __future__ import annotations

import logging
from functools import cache
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from chatsite_kernels import gated_delta_reference as reference
from chatsite_kernels.cpu import gated_delta as cpu_gated_delta
from inference.layers.attention_context import AttentionContext
from inference.layers.linear import Linear
from inference.layers.norm import GatedRMSNorm
from inference.model_config import GatedDeltaNetConfig, ModelConfig

logger = logging.getLogger(__name__)


@cache
def _triton_ops() -> ModuleType | None:
    try:
        from chatsite_kernels.triton import ops as triton_ops  # noqa: PLC0415 - lazy: needs triton and a GPU
    except ImportError as exc:  # pragma: no cover - depends on the machine
        logger.warning("chatsite_kernels.triton.ops unavailable (%s); the delta rule runs in PyTorch", exc)
        return None
    return triton_ops


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> torch.Tensor:
    """The gated delta rule over a packed step (``reference.gated_delta_varlen``'s
    arguments): the Triton kernel on CUDA, the C kernel on the CPU in fp32 where it is
    built, else the reference."""
    if q.is_cuda and ssm_pool.is_contiguous() and (ops := _triton_ops()) is not None:
        return ops.gated_delta_varlen(q, k, v, g, beta, ssm_pool, slots, has_initial, query_start_loc)
    if cpu_gated_delta.supports(q, k, v, g, beta, ssm_pool) and ssm_pool.is_contiguous():
        return cpu_gated_delta.gated_delta_varlen(
            q, k, v, g, beta, ssm_pool, slots, has_initial, query_start_loc
        )
    return reference.gated_delta_varlen(q, k, v, g, beta, ssm_pool, slots, has_initial, query_start_loc)


def linear_attention_config(config: ModelConfig) -> GatedDeltaNetConfig:
    assert config.linear_attention is not None, "a hybrid model needs ModelConfig.linear_attention"
    return config.linear_attention


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, state_index: int) -> None:
        """``state_index``: this layer's place among the model's recurrent layers (its
        tensors in ``RecurrentStates.conv`` / ``.ssm``)."""
        super().__init__()
        la = linear_attention_config(config)
        self.state_index = state_index
        self.num_k_heads, self.num_v_heads = la.num_k_heads, la.num_v_heads
        self.head_k_dim, self.head_v_dim = la.head_k_dim, la.head_v_dim
        self.key_dim, self.value_dim = la.num_k_heads * la.head_k_dim, la.num_v_heads * la.head_v_dim
        self.fused = la.fused_projections
        hidden = config.hidden_size
        if self.fused:
            self.in_proj_qkvz = Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = Linear(hidden, 2 * self.num_v_heads, bias=False)
        else:
            self.in_proj_qkv = Linear(hidden, la.conv_dim, bias=False)
            self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = Linear(hidden, self.num_v_heads, bias=False)
            self.in_proj_a = Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(la.conv_dim, la.conv_dim, la.conv_kernel, groups=la.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden, bias=False)

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q|k|v ``[T, conv_dim]`` in the convolution's channel order, z ``[T, Hv, Dv]``,
        b ``[T, Hv]``, a ``[T, Hv]``)."""
        tokens = hidden.shape[0]
        if not self.fused:
            z = self.in_proj_z(hidden).view(tokens, self.num_v_heads, self.head_v_dim)
            return self.in_proj_qkv(hidden), z, self.in_proj_b(hidden), self.in_proj_a(hidden)
        # Qwen3-Next groups the projection per key head: [q, k, v of its value heads, z of them].
        per_key = self.num_v_heads // self.num_k_heads
        dk, group_v = self.head_k_dim, per_key * self.head_v_dim
        qkvz = self.in_proj_qkvz(hidden).view(tokens, self.num_k_heads, 2 * dk + 2 * group_v)
        q, k, v, z = qkvz.split([dk, dk, group_v, group_v], dim=-1)
        b, a = self.in_proj_ba(hidden).view(tokens, self.num_k_heads, 2 * per_key).split(per_key, dim=-1)
        qkv = torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)), dim=-1)
        z = z.reshape(tokens, self.num_v_heads, self.head_v_dim)
        return qkv, z, b.reshape(tokens, self.num_v_heads), a.reshape(tokens, self.num_v_heads)

    def forward(self, hidden: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        recurrent = ctx.recurrent
        if recurrent is None:
            raise ValueError("a Gated DeltaNet layer needs AttentionContext.recurrent (its state slots)")
        tokens = hidden.shape[0]
        slots, has_initial = recurrent.state_slots, recurrent.has_initial_state
        starts = ctx.query_start_loc if recurrent.query_start_loc is None else recurrent.query_start_loc
        qkv, z, b, a = self.project(hidden)
        mixed = reference.causal_conv1d_varlen(
            qkv,
            self.conv1d.weight[:, 0, :],
            recurrent.states.conv[self.state_index],
            slots,
            has_initial,
            starts,
        )
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = reference.l2_normalize(q.reshape(tokens, self.num_k_heads, self.head_k_dim).float())
        k = reference.l2_normalize(k.reshape(tokens, self.num_k_heads, self.head_k_dim).float())
        q = q * self.head_k_dim**-0.5
        per_key = self.num_v_heads // self.num_k_heads
        if per_key > 1:  # each key head serves its consecutive value heads
            q, k = q.repeat_interleave(per_key, dim=1), k.repeat_interleave(per_key, dim=1)
        v = v.reshape(tokens, self.num_v_heads, self.head_v_dim).float()
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        out = delta_rule(q, k, v, g, beta, recurrent.states.ssm[self.state_index], slots, has_initial, starts)
        out = self.norm(out.to(hidden.dtype).reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(tokens, self.value_dim))
