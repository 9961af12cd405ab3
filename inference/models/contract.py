"""What the engine needs from a model class: the one contract every decoder keeps.

The runner, the KV stack, CUDA graphs and the loader call these members and nothing
else; none of them probes a model with ``hasattr``. A class that has no CPU kernel
path still provides ``prepare_cpu_kernels`` (doing nothing), and one whose forward
cannot be captured in a CUDA graph says so with ``supports_cuda_graphs = False``.

Every model is also a ``torch.nn.Module``; the members of ``nn.Module`` the engine
uses (``parameters``, ``state_dict``, ``eval``) are listed here so that a type
checker holds the engine to them too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from inference.kv.spec import KVSpec
from inference.kv.state_spec import RecurrentSpec
from inference.layers.attention_context import AttentionContext
from inference.model_config import ModelConfig


@runtime_checkable
class CausalLM(Protocol):
    """A decoder over the engine's paged KV pool.

    - ``forward(input_ids [T], positions [T], ctx, kv_cache) -> hidden [T, H]``: the
      step's packed tokens of many sequences; ``ctx`` says where each token's K/V goes
      and what it attends to; ``kv_cache`` is the pool laid out by ``kv_spec``.
    - ``compute_logits(hidden [N, H]) -> [N, vocab]`` fp32, for the sampled rows only.
    - ``load_weights(state_dict, device, dtype)``: install an HF-named state dict (the
      model was built on the meta device); a missing or unexpected weight is an error.
    - ``prepare_cpu_kernels()``: called once by the runner on the CPU before the pool
      exists, to pack weights for the C kernels; a no-op where the class has none.
    - ``supports_cuda_graphs``: False where the forward syncs with the host (then decode
      steps run eagerly on CUDA).
    """

    config: ModelConfig
    supports_cuda_graphs: bool

    @property
    def kv_spec(self) -> KVSpec: ...

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None: ...

    def prepare_cpu_kernels(self) -> None: ...

    # --- the nn.Module members the engine relies on ---
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def eval(self) -> Any: ...


class CausalLMClass(Protocol):
    """The class side: built from a ``ModelConfig`` (on the meta device by the loader),
    and able to name its pool layout before any instance exists (pool sizing).
    ``recurrent_spec_for`` names a hybrid model's recurrent layers (their per-sequence
    states, kept in the engine's state pool); None for a model without any."""

    def __call__(self, config: ModelConfig) -> CausalLM: ...

    def kv_spec_for(self, config: ModelConfig) -> KVSpec: ...

    def recurrent_spec_for(self, config: ModelConfig) -> RecurrentSpec | None: ...
