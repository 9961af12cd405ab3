"""Beam search on forked sequences that share KV blocks.

All beams of a request are scheduled together (see ``Scheduler._plan``), so each
step sees every live beam's logits at once. The beams are ordinary sequences: a
beam that continues keeps its blocks, a beam chosen twice is forked (blocks
shared, the partly filled tail copied on first write) and a beam that loses is
freed at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from inference.engine.sequence import Request, Sequence

if TYPE_CHECKING:
    from inference.engine.llm_engine import LLMEngine


def beam_score(request: Request, seq: Sequence) -> float:
    """Cumulative logprob over length ** length_penalty (0 = no normalisation)."""
    length = max(1, seq.num_output_tokens)
    return seq.cumulative_logprob / length**request.params.length_penalty


def rank_beams(engine: LLMEngine, request: Request, candidates: list[Sequence]) -> list[Sequence]:
    """The request's n best, indexed in order, with their text decoded."""
    ranked = sorted(candidates, key=lambda s: -beam_score(request, s))[: request.params.n]
    for index, seq in enumerate(ranked):
        seq.index = index
        seq.output_text = engine.tokenizer.decode(
            [t for t in seq.output_token_ids if t not in engine.eos_token_ids]
        )
    return ranked


def beam_step(engine: LLMEngine, request: Request, logits: torch.Tensor, beams: list[Sequence]) -> bool:
    """One step of beam search over the group's live beams. Returns True when done.

    Candidates are the 2·width best (beam, token) extensions by cumulative logprob;
    an end token in the top width ends a hypothesis, the best ``width`` others
    continue. A continuing beam reuses its parent's Sequence (and blocks); a
    parent chosen more than once is forked, so siblings share the prefix's blocks
    and copy only the partly filled tail on their first write."""
    params = request.params
    width = params.beam_width or 1
    stop_ids = set(params.stop_token_ids or ()) | (set() if params.ignore_eos else set(engine.eos_token_ids))
    logp = logits.float().log_softmax(dim=-1)
    vocab = logp.shape[1]
    cum = torch.tensor([b.cumulative_logprob for b in beams], device=logp.device)
    top_scores, top_ids = (cum[:, None] + logp).view(-1).topk(min(2 * width, logp.numel()))
    chosen: dict[int, list[tuple[int, float]]] = {}
    kept = 0
    for rank, (score, flat) in enumerate(zip(top_scores.tolist(), top_ids.tolist(), strict=True)):
        parent, token = divmod(flat, vocab)
        if token in stop_ids:
            if rank < width:
                hyp = Sequence(beams[parent].token_ids + [token], request.num_prompt_tokens, request=request)
                hyp.cumulative_logprob, hyp.finish_reason, hyp.stop_reason = score, "stop", token
                request.beam_hyps.append(hyp)
            continue
        chosen.setdefault(parent, []).append((token, score))
        kept += 1
        if kept == width:
            break
    request.forked = True
    for i, beam in enumerate(beams):
        if i not in chosen:
            engine.scheduler.drop_seq(request, beam)
    for i, extensions in chosen.items():
        parent = beams[i]
        for token, score in extensions[1:]:
            child = engine.fork(request, parent, index=0)
            child.token_ids.append(token)
            child.cumulative_logprob = score
        token, score = extensions[0]
        parent.token_ids.append(token)
        parent.cumulative_logprob = score
    live = request.seqs
    if live and (
        (params.max_tokens is not None and live[0].num_output_tokens >= params.max_tokens)
        or live[0].num_tokens >= engine.max_model_len
    ):
        for beam in list(live):
            beam.finish_reason = "length"
            request.beam_hyps.append(beam)
            engine.scheduler.drop_seq(request, beam)
    request.beam_hyps.sort(key=lambda s: -beam_score(request, s))
    del request.beam_hyps[width:]
    done = not request.seqs
    if not done and len(request.beam_hyps) >= width:
        best_live = max(beam_score(request, s) for s in request.seqs)
        done = beam_score(request, request.beam_hyps[-1]) >= best_live
    if done:
        for beam in list(request.seqs):
            engine.scheduler.drop_seq(request, beam)
        engine.scheduler.retire(request)
        request.beam_outputs = rank_beams(engine, request, request.beam_hyps)
        engine.requests.pop(request.request_id, None)
        request.finish_time = time.monotonic()
    return done
