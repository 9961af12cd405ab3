"""Applies each constrained row's token bitmask to a batch of logits."""

from __future__ import annotations

from typing import Any

import torch

_batch_matcher: Any = None


@torch.inference_mode()
def apply_grammar_masks(logits: torch.Tensor, seqs: list[Any]) -> torch.Tensor:
    """``logits`` (one row per sequence of ``seqs``) with the disallowed tokens of every
    sequence that has a grammar set to -inf (in place when already float32; returned).
    Rows without a grammar are untouched. Applied before penalties, temperature, top-k
    and top-p, so those see only allowed tokens and the softmax renormalises over them."""
    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
    if not rows:
        return logits
    import xgrammar as xgr

    if logits.dtype != torch.float32:
        logits = logits.float()
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[1])
    live, live_rows, failed = [], [], []
    for i in rows:
        matcher = seqs[i].grammar.get_matcher()
        if matcher is None:
            failed.append(i)
        else:
            live.append(matcher)
            live_rows.append(i)
    if len(live) > 1:
        _batch().batch_fill_next_token_bitmask(live, bitmask, indices=live_rows)
    elif live:
        live[0].fill_next_token_bitmask(bitmask, live_rows[0])
    for i in live_rows:
        keep = seqs[i].grammar.keep
        if keep is not None:
            bitmask[i, : keep.shape[0]] &= keep
    if live_rows:
        xgr.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device, non_blocking=True), indices=live_rows
        )
    for i in failed:
        _only_eos(logits[i], seqs[i])
    return logits


def _only_eos(row: torch.Tensor, seq: Any) -> None:
    """A sequence whose grammar failed may only end."""
    eos = [t for t in seq.grammar.stop_token_ids if t < row.shape[0]]
    keep = row[eos].clone() if eos else None
    row.fill_(float("-inf"))
    if eos:
        row[eos] = torch.maximum(keep, torch.zeros_like(keep))


def _batch() -> Any:
    global _batch_matcher
    if _batch_matcher is None:
        import xgrammar as xgr

        _batch_matcher = xgr.BatchGrammarMatcher()
    return _batch_matcher
