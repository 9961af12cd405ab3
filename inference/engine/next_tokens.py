"""The next token of every ordinary (not beam-search) sequence that reached its end this step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.outputs import StreamDelta
from inference.engine.sequence import Request, Sequence
from inference.engine.sequence_factory import SequenceFactory
from inference.sampling.beam_search import final_beam_deltas
from inference.sampling.sampler import Sampler
from inference.sampling.stop_rules import append_token, stream_deltas
from inference.structured import apply_grammar_masks


def sample_next_tokens(
    seqs: list[Sequence],
    logits: torch.Tensor,
    groups: dict[Request, list[int]],
    *,
    sampler: Sampler,
    sequences: SequenceFactory,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> int:
    """Sample and append a token (with its stop rules) to the sequences of ``groups``
    (request -> its rows of ``seqs`` and ``logits``), skipping beam-search requests;
    returns how many tokens were sampled. The first token of n parallel samples splits
    the prompt's sequence (sharing its blocks), and each child samples from the same
    logits with its own noise."""
    rows: list[int] = []
    sample_seqs: list[Sequence] = []
    for request, request_rows in groups.items():
        if request.params.use_beam_search:
            continue
        if not request.forked and request.params.n > 1:
            parent = seqs[request_rows[0]]
            for index in range(1, request.params.n):
                sequences.fork(request, parent, index)
            request.forked = True
            rows += request_rows * request.params.n
            sample_seqs += request.seqs
        else:
            rows += request_rows
            sample_seqs += [seqs[r] for r in request_rows]
    if not sample_seqs:
        return 0
    chosen = logits if rows == list(range(len(seqs))) else logits[rows]
    params = [s.request.params for s in sample_seqs]  # type: ignore[union-attr]
    chosen = apply_grammar_masks(chosen, sample_seqs)
    result = sampler(chosen, sample_seqs, params)
    for i, (seq, token) in enumerate(zip(sample_seqs, result.token_ids, strict=True)):
        if result.top_logprobs is not None and seq.logprobs is not None:
            seq.cumulative_logprob += result.logprobs[i]  # type: ignore[index]
            seq.logprobs.append(result.top_logprobs[i])  # type: ignore[arg-type]
        if seq.grammar is not None:
            seq.grammar.accept(token)
        append_token(seq, token, eos_token_ids, max_model_len)
    return len(sample_seqs)


def finish_for_length(
    request: Request, rank: Callable[[Request, list[Sequence]], list[Sequence]]
) -> list[StreamDelta]:
    """End every live sequence of ``request`` with ``finish_reason="length"`` (the KV pool
    could not hold it); a beam search ranks what it has (``rank``). Its final deltas."""
    if request.params.use_beam_search:
        for seq in request.seqs:
            seq.finish_reason = "length"
        request.beam_outputs = rank(request, request.beam_hyps + request.seqs)
        request.seqs = []
        return final_beam_deltas(request)
    live = list(request.seqs)
    for seq in live:
        seq.finish_reason = "length"
        seq.output_text += seq.detokenizer.flush()
        request.seqs.remove(seq)
        request.finished_seqs.append(seq)
    return stream_deltas(request, live)
