"""Beam search on forked sequences that share KV blocks.

All beams of a request are scheduled together (see ``Scheduler._plan``), so each
step sees every live beam's logits at once. The beams are ordinary sequences: a
beam that continues keeps its blocks, a beam chosen twice is forked (blocks
shared, the partly filled tail copied on first write) and a beam that loses is
freed at once.

``beam_step`` only decides: it returns a ``BeamDecision`` and changes nothing, and the
engine, which owns the scheduler and the blocks, applies it (``LLMEngine``'s
``_apply_beam_decision``). What a decision leaves to the caller, in order: free
``drop``; apply ``extend`` (forking where asked); if ``out_of_length``, end every live
beam as a "length" hypothesis; ``keep_best_hypotheses`` with the new ones; if ``done``,
free what is left and ``rank_beams``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.engine.outputs import StreamDelta
from inference.engine.sequence import Request, Sequence
from inference.sampling.stop_rules import stream_deltas
from inference.tokenizer import Tokenizer


@dataclass
class BeamExtension:
    """One beam after this step: ``parent`` plus ``token``, scored ``cumulative_logprob``."""

    parent: Sequence
    token: int
    cumulative_logprob: float
    fork: bool  # True: a new sibling forked from parent (sharing its blocks); False: parent itself


@dataclass
class BeamDecision:
    drop: list[Sequence] = field(default_factory=list)  # beams that lost: free them
    # In the order to apply: a parent's forks come before the parent's own token, so each
    # fork copies the parent's tokens as they were before this step.
    extend: list[BeamExtension] = field(default_factory=list)
    hypotheses: list[Sequence] = field(default_factory=list)  # ended on a stop token; hold no blocks
    out_of_length: bool = False  # the extended beams reach max_tokens or the context: they end too
    done: bool = False  # the request finishes with this step


def beam_score(request: Request, seq: Sequence) -> float:
    """Cumulative logprob over length ** length_penalty (0 = no normalisation)."""
    return _score(request, seq.cumulative_logprob, seq.num_output_tokens)


def _score(request: Request, cumulative_logprob: float, num_output_tokens: int) -> float:
    return cumulative_logprob / max(1, num_output_tokens) ** request.params.length_penalty


def beam_step(
    request: Request,
    logits: torch.Tensor,
    beams: list[Sequence],
    *,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> BeamDecision:
    """One step of beam search over the group's live beams.

    Candidates are the 2·width best (beam, token) extensions by cumulative logprob;
    an end token in the top width ends a hypothesis, the best ``width`` others
    continue. A continuing beam reuses its parent's Sequence (and blocks); a
    parent chosen more than once is forked, so siblings share the prefix's blocks
    and copy only the partly filled tail on their first write."""
    params = request.params
    width = params.beam_width or 1
    decision = BeamDecision()
    chosen = _choose_extensions(request, logits, beams, eos_token_ids, width, decision.hypotheses)
    decision.drop = [beam for i, beam in enumerate(beams) if i not in chosen]
    for i, extensions in chosen.items():
        parent = beams[i]
        for token, score in extensions[1:]:
            decision.extend.append(BeamExtension(parent, token, score, fork=True))
        token, score = extensions[0]
        decision.extend.append(BeamExtension(parent, token, score, fork=False))
    # Every beam has the same length, so one parent tells the length after this step.
    if decision.extend:
        parent = decision.extend[0].parent
        num_output = parent.num_output_tokens + 1
        decision.out_of_length = (
            params.max_tokens is not None and num_output >= params.max_tokens
        ) or parent.num_tokens + 1 >= max_model_len
    decision.done = decision.out_of_length or not decision.extend
    if not decision.done:
        best_hyps = _best(request, request.beam_hyps + decision.hypotheses, width)
        if len(best_hyps) >= width:
            best_live = max(_score(request, e.cumulative_logprob, num_output) for e in decision.extend)
            decision.done = beam_score(request, best_hyps[-1]) >= best_live
    return decision


def _choose_extensions(
    request: Request,
    logits: torch.Tensor,
    beams: list[Sequence],
    eos_token_ids: frozenset[int],
    width: int,
    hypotheses: list[Sequence],
) -> dict[int, list[tuple[int, float]]]:
    """The continuing extensions per beam index, best first; stop tokens ranked in the
    top ``width`` become new ``hypotheses``."""
    params = request.params
    stop_ids = set(params.stop_token_ids or ()) | (set() if params.ignore_eos else set(eos_token_ids))
    logp = logits.float().log_softmax(dim=-1)
    vocab = logp.shape[1]
    cum = torch.tensor([b.cumulative_logprob for b in beams], device=logp.device)
    top_scores, top_ids = (cum[:, None] + logp).view(-1).topk(min(2 * width, logp.numel()))
    chosen: dict[int, list[tuple[int, float]]] = {}
    kept = 0
    for rank, (score, flat) in enumerate(zip(top_scores.tolist(), top_ids.tolist(), strict=True)):
        if score == float("-inf"):
            break  # a grammar allowed fewer tokens than candidates: the rest are masked
        parent, token = divmod(flat, vocab)
        if token in stop_ids:
            if rank < width:
                hyp = Sequence(beams[parent].token_ids + [token], request.num_prompt_tokens, request=request)
                hyp.cumulative_logprob, hyp.finish_reason, hyp.stop_reason = score, "stop", token
                hypotheses.append(hyp)
            continue
        chosen.setdefault(parent, []).append((token, score))
        kept += 1
        if kept == width:
            break
    return chosen


def _best(request: Request, hypotheses: list[Sequence], width: int) -> list[Sequence]:
    return sorted(hypotheses, key=lambda s: -beam_score(request, s))[:width]


def keep_best_hypotheses(request: Request, new: list[Sequence]) -> None:
    """Add finished hypotheses; only the best ``beam_width`` are kept, best first."""
    request.beam_hyps = _best(request, request.beam_hyps + new, request.params.beam_width or 1)


def rank_beams(
    request: Request, candidates: list[Sequence], tokenizer: Tokenizer, eos_token_ids: frozenset[int]
) -> list[Sequence]:
    """The request's n best, indexed in order, with their text decoded."""
    ranked = sorted(candidates, key=lambda s: -beam_score(request, s))[: request.params.n]
    for index, seq in enumerate(ranked):
        seq.index = index
        seq.output_text = tokenizer.decode([t for t in seq.output_token_ids if t not in eos_token_ids])
    return ranked


def final_beam_deltas(request: Request) -> list[StreamDelta]:
    """Beams are only final at the end, so they stream as one delta per output."""
    for seq in request.beam_outputs or []:
        if seq.finish_reason is None:
            seq.finish_reason = "abort"
    return stream_deltas(request, request.beam_outputs or [])
