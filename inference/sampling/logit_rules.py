"""Per-request edits of the logits before sampling: OpenAI's ``logit_bias`` and vLLM's
``min_tokens`` (EOS and stop tokens masked until a sequence has that many output tokens).

Applied like the grammar masks: one scan of the batch for the rows that ask (a flag per
request, read once), then one scatter for the whole batch. Each request's bias is turned
into index and value tensors once, when first seen, and kept on its params; a step only
concatenates the tensors of the rows that need them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from inference.sampling.params import SamplingParams


@dataclass(frozen=True)
class TokenEdits:
    """One request's edits as tensors (on the logits' device)."""

    bias_ids: torch.Tensor  # long [k]
    bias_values: torch.Tensor  # float32 [k]
    end_ids: torch.Tensor  # long [m]: EOS and stop token ids, masked before min_tokens


def _edits(
    params: SamplingParams, eos_token_ids: Collection[int], vocab: int, device: torch.device
) -> TokenEdits:
    cached = params.token_edits
    if cached is not None and cached.bias_ids.device == device:
        return cached
    bias = {t: v for t, v in (params.logit_bias or {}).items() if t < vocab}
    ends = (
        sorted({t for t in (*eos_token_ids, *params.stop_token_ids) if t < vocab})
        if params.min_tokens
        else []
    )
    edits = TokenEdits(
        torch.tensor(list(bias), dtype=torch.long, device=device),
        torch.tensor(list(bias.values()), dtype=torch.float32, device=device),
        torch.tensor(ends, dtype=torch.long, device=device),
    )
    params.token_edits = edits
    return edits


@torch.inference_mode()
def apply_logit_rules(
    logits: torch.Tensor,
    seqs: Sequence[object],
    params: Sequence[SamplingParams],
    eos_token_ids: Collection[int],
) -> torch.Tensor:
    """``logits`` (float32, one row per sequence) with each row's ``logit_bias`` added and,
    for a sequence short of its ``min_tokens``, its end tokens set to -inf. Returns a new
    tensor when anything changed (the caller's logits, e.g. the raw ones logprobs are
    taken from, stay as they were); the same tensor otherwise."""
    rows = [i for i, p in enumerate(params) if p.edits_logits]
    if not rows:
        return logits
    vocab, device = logits.shape[1], logits.device
    bias_rows: list[int] = []
    bias_ids: list[torch.Tensor] = []
    bias_values: list[torch.Tensor] = []
    end_rows: list[int] = []
    end_ids: list[torch.Tensor] = []
    for i in rows:
        p = params[i]
        edits = _edits(p, eos_token_ids, vocab, device)
        if edits.bias_ids.numel():
            bias_rows.append(i)
            bias_ids.append(edits.bias_ids)
            bias_values.append(edits.bias_values)
        if edits.end_ids.numel() and seqs[i].num_output_tokens < p.min_tokens:  # type: ignore[attr-defined]
            end_rows.append(i)
            end_ids.append(edits.end_ids)
    if not bias_rows and not end_rows:
        return logits
    logits = logits.clone()
    if bias_rows:
        ids = torch.cat(bias_ids)
        owner = torch.repeat_interleave(
            torch.tensor(bias_rows, device=device), torch.tensor([t.numel() for t in bias_ids], device=device)
        )
        logits.index_put_((owner, ids), torch.cat(bias_values), accumulate=True)
    if end_rows:
        ids = torch.cat(end_ids)
        owner = torch.repeat_interleave(
            torch.tensor(end_rows, device=device), torch.tensor([t.numel() for t in end_ids], device=device)
        )
        logits.index_put_((owner, ids), torch.tensor(float("-inf"), device=device))
    return logits
