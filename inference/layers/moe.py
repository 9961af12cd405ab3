"""Mixtures of experts: DeepSeek-V3's (sigmoid router with group-limited top-k, shared
experts added densely) and Qwen3-MoE's (softmax router, top-k, no shared expert), with
the routed experts dispatched by expert.

Dispatch sorts the step's (token, expert) pairs by expert, so each active expert
runs one gate/up and one down product over all of its tokens; the Python loop is
over experts (at most ``num_experts`` iterations per layer and step), never over
tokens. Results are weighted and scattered back with one ``index_add_``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chatsite_kernels.cpu.quant import QuantRows
from inference.layers.mlp import MLP
from inference.model_config import ModelConfig, MoEConfig


class TopkRouter(nn.Module):
    """``(weights [T, k] fp32, expert ids [T, k])`` per token, as DeepSeek-V3 routes:

    - scores are sigmoid(router logits), computed in fp32;
    - the bias ``e_score_correction_bias`` steers the choice only, not the weights;
    - experts are chosen among the ``topk_groups`` groups whose two best biased scores
      sum highest;
    - the chosen scores are renormalised (``norm_topk_prob``) and scaled by
      ``routed_scaling_factor``.
    """

    def __init__(self, config: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(moe.num_experts))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moe = self.moe
        scores = F.linear(hidden.float(), self.weight.float()).sigmoid()
        biased = scores + self.e_score_correction_bias.float()
        if moe.topk_groups < moe.num_groups:
            grouped = biased.view(-1, moe.num_groups, moe.num_experts // moe.num_groups)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            keep = group_scores.topk(moe.topk_groups, dim=-1).indices
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            biased = biased.masked_fill(
                ~group_mask.repeat_interleave(grouped.shape[-1], dim=1), float("-inf")
            )
        ids = biased.topk(moe.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if moe.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * moe.routed_scaling_factor, ids


class SoftmaxTopkRouter(nn.Module):
    """``(weights [T, k] fp32, expert ids [T, k])`` per token, as Qwen3-MoE routes:
    softmax over all experts' router logits (in fp32), the ``top_k`` best kept and,
    with ``norm_topk_prob``, renormalised to sum to one. The logits are computed in
    the model's dtype, as transformers does."""

    def __init__(self, config: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, config.hidden_size))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = F.linear(hidden, self.weight).softmax(dim=-1, dtype=torch.float32)
        weights, ids = probs.topk(self.moe.top_k, dim=-1)
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(hidden.dtype).float(), ids


class RoutedExperts(nn.Module):
    """All routed experts' SwiGLU weights stacked: ``gate_up_proj`` ``[E, 2I, H]`` (gate
    rows first) and ``down_proj`` ``[E, H, I]``; the loader stacks HF's per-expert
    ``experts.{e}.{gate,up,down}_proj.weight`` into them."""

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        e, inter = moe.num_experts, moe.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * inter, hidden_size))
        self.down_proj = nn.Parameter(torch.zeros(e, hidden_size, inter))

    def forward(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        tokens, top_k = ids.shape
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.gate_up_proj.shape[0]).tolist()
        token_of = order // top_k
        rows = hidden.index_select(0, token_of)  # the step's tokens, grouped by expert
        out = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            gate, up = F.linear(rows[start:end], self.gate_up_proj[expert]).chunk(2, dim=-1)
            out[start:end] = F.linear(F.silu(gate) * up, self.down_proj[expert])
            start = end
        out *= weights.reshape(-1)[order, None].to(out.dtype)
        return torch.zeros_like(hidden).index_add_(0, token_of, out)


class MoE(nn.Module):
    """Routed experts plus the always-on shared experts (one SwiGLU of
    ``num_shared_experts * intermediate_size``, where the model has them).

    On the CPU kernels' path only the shared experts are packed: the routed experts'
    products are per-expert slices of a stacked weight, computed by PyTorch."""

    def __init__(self, config: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.gate: nn.Module = (
            SoftmaxTopkRouter(config, moe) if moe.scoring == "softmax" else TopkRouter(config, moe)
        )
        self.experts = RoutedExperts(config.hidden_size, moe)
        self.shared_experts = (
            MLP(config, intermediate_size=moe.intermediate_size * moe.num_shared_experts)
            if moe.num_shared_experts
            else None
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(hidden)
        out = self.experts(hidden, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return out

    def prepare_packed(self) -> None:
        if self.shared_experts is not None:
            self.shared_experts.prepare_packed()

    def release_weights(self) -> None:
        if self.shared_experts is not None:
            self.shared_experts.release_weights()

    def set_quantized(self, rows: dict[str, QuantRows]) -> None:
        """Quantized GGUF rows of this block: the shared experts' keep the quantized
        kernels; the routed experts' and the router's are de-quantized by the caller."""
        shared = {
            n.removeprefix("shared_experts."): r for n, r in rows.items() if n.startswith("shared_experts.")
        }
        if shared and self.shared_experts is not None:
            self.shared_experts.set_quantized(shared)


def stack_expert_weights(
    weights: dict[str, torch.Tensor], num_layers: int, moe: MoEConfig
) -> dict[str, torch.Tensor]:
    """HF's per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight`` -> the stacked
    ``experts.gate_up_proj`` / ``experts.down_proj`` of ``RoutedExperts`` (in place);
    layers already stacked (transformers' fused layout, or ours) are left alone."""
    for layer in range(num_layers):
        if not moe.is_sparse(layer):
            continue
        prefix = f"model.layers.{layer}.mlp.experts."
        if f"{prefix}gate_up_proj" in weights:
            continue
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
