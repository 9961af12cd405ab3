"""transformers' own greedy generation: the reference every engine exactness test compares to."""

from __future__ import annotations

import torch


def hf_greedy(model: torch.nn.Module, ids: list[int], max_new_tokens: int) -> list[int]:
    """The ``max_new_tokens`` tokens HF ``generate`` picks greedily after ``ids``."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()
