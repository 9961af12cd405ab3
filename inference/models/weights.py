"""Installing an HF-named state dict as a model's parameters (plain, unquantized weights)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def assign_weights(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    *,
    optional: tuple[str, ...] = (),
    ignored_suffixes: tuple[str, ...] = ("rotary_emb.inv_freq",),
) -> None:
    """Assign (not copy) each parameter from ``state_dict``, moved to ``device``/``dtype``,
    so a model built on the meta device never allocates twice. ``optional`` names may be
    absent (a tied LM head); names ending in ``ignored_suffixes`` may be extra. Anything
    else missing, extra or misshapen is an error."""
    params = dict(model.named_parameters())  # a tied lm_head is deduplicated away here
    missing = [name for name in params if name not in state_dict and name not in optional]
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
    unexpected = [
        name
        for name in state_dict
        if name not in params and name not in optional and not name.endswith(ignored_suffixes)
    ]
    if unexpected:
        raise KeyError(f"checkpoint has weights this model lacks, e.g. {unexpected[:3]}")
    for name, param in params.items():
        if name not in state_dict:
            continue
        tensor = state_dict[name]
        if tensor.shape != param.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
        tensor = tensor.to(device=device or param.device, dtype=dtype or param.dtype)
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(tensor, requires_grad=False))
