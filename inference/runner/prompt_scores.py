"""Prompt log-probabilities: the logits of prompt positions, for the requests that ask.

A step normally runs the LM head only on each sequence's last position. A request with
``prompt_logprobs`` (an echo with logprobs, a log-likelihood evaluation) also needs
position ``p``'s distribution over token ``p + 1`` for every prompt token but the first.
Those rows go through the head here, in slices (a long chunk's full logits would be rows x
vocabulary floats at once), and each prompt token's entry (its own logprob and the top
``prompt_logprobs``) is appended to ``request.prompt_logprobs``, whose first entry is None.

A request that scores its prompt bypasses the prefix cache (``BlockManager.match_prefix``):
cached tokens are never run, so they would have no logits. Entries are appended in
position order and only once, so a recomputation after preemption adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.sequence import Request, Sequence

_SLICE_ROWS = 256  # rows of logits at once: 256 x 49k floats is 50 MB


@dataclass
class ScoredRows:
    """The hidden-state rows to score, and for each its request and position."""

    rows: list[int]
    targets: list[int]  # the prompt token each row predicts
    owners: list[Request]  # the Request of each row
    positions: list[int]  # the predicted token's position (>= 1)


def rows_to_score(seqs: list[Sequence], num_new_tokens: list[int]) -> ScoredRows:
    """Rows of one step's flat batch whose logits score a prompt token not scored yet."""
    out = ScoredRows([], [], [], [])
    row = 0
    for seq, n in zip(seqs, num_new_tokens, strict=True):
        request = seq.request if seq.score_prompt else None
        if request is not None and request.prompt_logprobs is not None:
            start = seq.num_computed_tokens
            scored = len(request.prompt_logprobs)  # positions 0 .. scored - 1 have entries
            last = min(start + n, request.num_prompt_tokens - 1)  # positions start .. last - 1 predict
            for p in range(max(start, scored - 1), last):
                out.rows.append(row + p - start)
                out.targets.append(request.prompt_token_ids[p + 1])
                out.owners.append(request)
                out.positions.append(p + 1)
        row += n
    return out


@torch.inference_mode()
def score_prompt_rows(
    hidden: torch.Tensor, scored: ScoredRows, compute_logits: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Append each scored row's entry to its request's ``prompt_logprobs``."""
    device = hidden.device
    for begin in range(0, len(scored.rows), _SLICE_ROWS):
        end = begin + _SLICE_ROWS
        rows = torch.tensor(scored.rows[begin:end], device=device)
        targets = torch.tensor(scored.targets[begin:end], device=device)
        logp = compute_logits(hidden[rows]).float().log_softmax(dim=-1)
        chosen = logp.gather(1, targets[:, None]).squeeze(1).tolist()
        owners = scored.owners[begin:end]
        k = max(r.params.prompt_logprobs or 0 for r in owners)
        top_vals, top_ids = logp.topk(k, dim=-1) if k else (None, None)
        top_vals = top_vals.tolist() if top_vals is not None else None
        top_ids = top_ids.tolist() if top_ids is not None else None
        for i, request in enumerate(owners):
            entries = request.prompt_logprobs
            if entries is None or len(entries) != scored.positions[begin + i]:
                continue  # already scored (a recomputation)
            entry = {scored.targets[begin + i]: chosen[i]}
            want = request.params.prompt_logprobs or 0
            if want and top_ids is not None and top_vals is not None:
                entry.update(zip(top_ids[i][:want], top_vals[i][:want], strict=True))
                entry[scored.targets[begin + i]] = chosen[i]
            entries.append(entry)
            if len(entries) == request.num_prompt_tokens:
                for seq in request.seqs:
                    seq.score_prompt = False
