"""The next token of every ordinary (not beam-search) sequence that reached its end this step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.outputs import StreamDelta
from inference.engine.sequence import Request, Sequence
from inference.engine.sequence_factory import SequenceFactory
from inference.sampling.beam_search import final_beam_deltas
from inference.sampling.params import SamplingParams
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
    params: list[SamplingParams] = []
    for request, request_rows in groups.items():
        request_params = request.params
        if request_params.use_beam_search:
            continue
        if request_params.max_tokens == 0:  # the prompt alone was asked for (scored): no token
            for r in request_rows:
                seqs[r].finish_reason = "length"
            continue
        if len(request_rows) == 1 and (request.forked or request_params.n == 1):  # most requests
            rows.append(request_rows[0])
            sample_seqs.append(seqs[request_rows[0]])
            params.append(request_params)
            continue
        if not request.forked and request_params.n > 1:
            parent = seqs[request_rows[0]]
            for index in range(1, request_params.n):
                sequences.fork(request, parent, index)
            request.forked = True
            rows += request_rows * request_params.n
            sample_seqs += request.seqs
        else:
            rows += request_rows
            sample_seqs += [seqs[r] for r in request_rows]
        params += [request_params] * (len(sample_seqs) - len(params))
    if not sample_seqs:
        return 0
    chosen = logits if rows == list(range(len(seqs))) else logits[rows]
    chosen = apply_grammar_masks(chosen, sample_seqs)
    result = sampler(chosen, sample_seqs, params)
    if result.top_logprobs is not None:
        for seq, logprob, top in zip(sample_seqs, result.logprobs, result.top_logprobs, strict=True):  # type: ignore[arg-type]
            if seq.logprobs is not None:
                seq.cumulative_logprob += logprob
                seq.logprobs.append(top)  # type: ignore[arg-type]
    for seq, token, seq_params in zip(sample_seqs, result.token_ids, params, strict=True):
        if seq.grammar is not None:
            seq.grammar.accept(token)
        append_token(seq, token, eos_token_ids, max_model_len, seq_params)
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
