"""What the decoders over a K-and-V paged pool share: the pool's layout, the LM head
tied to the embeddings, and the rotary table that follows the positions' device.

Llama, Gemma and gpt-oss differ in their layers, not in these; DeepSeek-V3 keeps
one latent plane per token and so declares its own ``kv_spec_for``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from inference.kv.spec import KVSpec
from inference.kv.state_spec import RecurrentSpec
from inference.layers.attention_context import AttentionContext
from inference.model_config import ModelConfig


class KVHeadsDecoder(nn.Module):
    """Base of the ``*ForCausalLM`` classes whose pool holds K and V per KV head.

    Subclasses set ``self.config`` and ``self.model`` (with ``embed_tokens``) before
    calling ``_attach_lm_head``."""

    config: ModelConfig
    model: nn.Module
    lm_head: nn.Module

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(
            config.num_layers,
            planes=2,
            token_shape=(config.num_kv_heads, config.head_dim),
            windows=config.layer_windows,
        )

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @classmethod
    def recurrent_spec_for(cls, config: ModelConfig) -> RecurrentSpec | None:
        """No recurrent layers: every layer attends over the paged KV pool."""
        return None

    def _attach_lm_head(self, head: nn.Module) -> None:
        self.lm_head = head
        self._tie_lm_head()

    def _tie_lm_head(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _tie_or_require_lm_head(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """After loading: the head shares the embeddings, or the checkpoint carried it."""
        self._tie_lm_head()
        if not self.config.tie_word_embeddings and "lm_head.weight" not in state_dict:
            raise KeyError("checkpoint lacks lm_head.weight (and the embeddings are not tied)")


def table_on(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A rotary table on ``device``. The tables stay outside the module's buffers so that
    ``.to(bfloat16)`` does not round their angles; callers keep the moved copy."""
    return table if table.device == device else table.to(device)


def run_layers(
    model: nn.Module,
    cos_sin: torch.Tensor,
    input_ids: torch.Tensor,
    ctx: AttentionContext,
    kv_cache: torch.Tensor,
) -> torch.Tensor:
    """The embeddings, every layer with the step's rotary rows, the final norm: the forward of
    a decoder whose layers each take ``(hidden, cos_sin, ctx, kv_cache)``."""
    hidden = model.embed_tokens(input_ids)
    for layer in model.layers:
        hidden = layer(hidden, cos_sin, ctx, kv_cache)
    return model.norm(hidden)
