"""Stop rules and stream deltas: what one sampled token does to a sequence.

A token ends a sequence at an EOS or stop token, at ``max_tokens`` or the context's end,
or when the text completes a stop string (cut from the output). While streaming, text
that could still become a stop string is held back.
"""

from __future__ import annotations

import functools

from inference.engine.outputs import StreamDelta
from inference.engine.sequence import Request, Sequence
from inference.sampling.params import SamplingParams


def append_token(
    seq: Sequence,
    token: int,
    eos_token_ids: frozenset[int],
    max_model_len: int,
    params: SamplingParams | None = None,
) -> None:
    """Append a sampled token to ``seq``: its text, and the stop rules it may meet
    (``params``: its request's, where the caller has them at hand). Run for every token of
    every sequence: attributes are read once, not through the sequence's properties."""
    if params is None:
        params = seq.request.params  # type: ignore[union-attr]
    token_ids = seq.token_ids
    token_ids.append(token)
    # Before min_tokens no stop rule applies (vLLM's rule; the sampler masks the end tokens).
    stops = not params.min_tokens or len(token_ids) - seq.num_prompt_tokens > params.min_tokens
    if stops and ((token in eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids):
        seq.finish_reason, seq.stop_reason = "stop", token
    else:
        text = seq.detokenizer.push(token)
        if text:
            seq.output_text += text
            if params.stop and stops:
                check_stop_strings(seq, params, len(text))
    if seq.finish_reason is None:
        num_tokens = len(token_ids)
        max_tokens = params.max_tokens
        if (max_tokens is not None and num_tokens - seq.num_prompt_tokens >= max_tokens) or (
            num_tokens >= max_model_len
        ):
            seq.finish_reason = "length"
    if seq.finish_reason is not None and not isinstance(seq.stop_reason, str):
        seq.output_text += seq.detokenizer.flush()


def check_stop_strings(seq: Sequence, params: SamplingParams, num_new_chars: int) -> None:
    """End at the earliest stop string that the new text completes; the stop
    string itself is cut from the output (unless include_stop_str_in_output)."""
    text = seq.output_text
    longest = max(len(s) for s in params.stop)  # type: ignore[union-attr]
    search_from = max(0, len(text) - num_new_chars - longest + 1)
    best: tuple[int, str] | None = None
    for stop in params.stop:  # type: ignore[union-attr]
        at = text.find(stop, search_from)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    if best is not None:
        at, stop = best
        seq.output_text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
        seq.finish_reason, seq.stop_reason = "stop", stop


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of ``text`` that could still become a stop string,
    so streaming must not show them yet. Linear in the stop strings' length: each is run
    once, as a KMP automaton, over the last ``len(stop) - 1`` characters."""
    held = 0
    last = text[-1:] if text else ""
    for stop in stops:
        if len(stop) > 1 and last in stop:  # the usual delta ends in a character no stop holds
            held = max(held, _prefix_overlap(text, stop))
    return held


def _prefix_overlap(text: str, stop: str) -> int:
    """Length of the longest proper prefix of ``stop`` that ``text`` ends with."""
    fail = _failure(stop)
    k = 0
    for ch in text[-(len(stop) - 1) :]:
        while k and stop[k] != ch:
            k = fail[k - 1]
        if stop[k] == ch:
            k += 1
    return k


@functools.lru_cache(maxsize=256)
def _failure(stop: str) -> tuple[int, ...]:
    """KMP's failure function of ``stop``: for each prefix, its longest proper border."""
    fail = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        if stop[i] == stop[k]:
            k += 1
        fail[i] = k
    return tuple(fail)


def stream_deltas(request: Request, seqs: list[Sequence]) -> list[StreamDelta]:
    """The deltas of ``seqs`` since their last ones: new text (less a possible stop
    string's beginning), new token ids and logprobs, a reasoning model's thinking apart."""
    out = []
    stops = request.params.stop or []
    for seq in seqs:
        text = seq.output_text
        upto = len(text) if seq.is_finished or not stops else len(text) - held_back(text, stops)
        upto = max(upto, seq.num_emitted_chars)
        new_tokens = seq.token_ids[seq.num_prompt_tokens + seq.num_emitted_tokens :]
        if not new_tokens and upto == seq.num_emitted_chars and not seq.is_finished:
            continue
        logprobs = None
        if seq.logprobs is not None:
            logprobs = seq.logprobs[seq.num_emitted_tokens :]
        new_text, reasoning = text[seq.num_emitted_chars : upto], ""
        if seq.reasoning is not None:
            reasoning, new_text = seq.reasoning.push(new_text)
            if seq.is_finished:
                more_reasoning, more_text = seq.reasoning.flush()
                reasoning, new_text = reasoning + more_reasoning, new_text + more_text
        out.append(
            StreamDelta(
                request_id=request.request_id,
                index=seq.index,
                text=new_text,
                token_ids=new_tokens,
                finished=seq.is_finished,
                finish_reason=seq.finish_reason,
                num_prompt_tokens=request.num_prompt_tokens,
                num_cached_tokens=request.num_cached_tokens,
                num_output_tokens=seq.num_output_tokens,
                logprobs=logprobs,
                stop_reason=seq.stop_reason,
                reasoning=reasoning,
            )
        )
        seq.num_emitted_chars = upto
        seq.num_emitted_tokens += len(new_tokens)
    if out and request.prompt_logprobs is not None and not request.prompt_logprobs_sent:
        out[0].prompt_logprobs = request.prompt_logprobs
        request.prompt_logprobs_sent = True
    if out and request.is_finished:
        out[-1].request_finished = True
    return out
