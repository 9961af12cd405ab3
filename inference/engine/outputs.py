"""What the engine hands back: streamed deltas, finished outputs and live stats."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.engine.sequence import Request


@dataclass
class StreamDelta:
    """New text and tokens of one completion since its previous delta."""

    request_id: str
    index: int  # completion index (n > 1)
    text: str
    token_ids: list[int]
    finished: bool  # this completion is done
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int  # so far, for this completion
    logprobs: list[dict[int, float]] | None = None  # per new token: top ids -> logprob (with the sampled id)
    request_finished: bool = False  # the last delta of the whole request
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    # New reasoning text (``text`` is then answer text only); "" unless the request asked
    # for separate_reasoning and the model's template marks reasoning.
    reasoning: str = ""
    # The request's prompt logprobs (params.prompt_logprobs), on its first delta only:
    # per prompt token {token id: logprob} with its top ones, the first token's None.
    prompt_logprobs: list[dict[int, float] | None] | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    reasoning: str = ""  # see StreamDelta.reasoning


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, float] | None] | None = None  # see StreamDelta

    # The first completion, for the common n == 1 case.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass
class EngineStats:
    running: int = 0  # requests
    waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_cached: int = 0  # free but holding a revivable prefix
    kv_blocks_free: int = 0
    kv_block_size: int = 0
    kv_slots_used: int = 0  # token slots holding K/V; kv waste = 1 - slots_used / (blocks_used * size)
    prefix_hit_rate: float = 0.0  # prompt tokens served from cache / prompt tokens
    prefix_hit_tokens: int = 0
    prefix_queried_tokens: int = 0
    tokens_per_s: float = 0.0  # generated tokens per second over the recent window
    total_generated_tokens: int = 0
    total_prompt_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    loading: int = 0  # requests waiting for KV blocks read from a lower tier
    num_swaps: int = 0  # preemptions that swapped blocks out instead of recomputing
    cached_tokens: int = 0  # prompt tokens served from any KV tier (first admissions)
    kv_retained_keys: int = 0  # retain() marks in force (e.g. conversations open in a tab)
    kv_retained_blocks: int = 0  # distinct block hashes they mark
    requests_by_outcome: dict[str, int] = field(default_factory=dict)  # stop/length/abort/error/rejected
    ttft: dict[str, Any] = field(default_factory=dict)  # histogram: buckets, counts, sum, count (seconds)
    tpot: dict[str, Any] = field(default_factory=dict)  # time per output token, same shape
    # Per tier ("pool", "host", "disk"): blocks, capacity_blocks, hit_tokens, bytes_written/read, ...
    kv_tiers: dict[str, dict[str, float]] = field(default_factory=dict)
    # Prefill workers (inference.pd), empty without: queue depth, transfers, fallbacks, ...
    disaggregation: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def request_output(request: Request) -> RequestOutput:
    """A request's outputs so far (final once it finished), completions in index order."""
    beam = request.params.use_beam_search
    outputs = [
        CompletionOutput(
            index=seq.index,
            text=seq.output_text if seq.reasoning is None else seq.reasoning.answer,
            reasoning="" if seq.reasoning is None else seq.reasoning.reasoning,
            token_ids=seq.output_token_ids,
            cumulative_logprob=seq.cumulative_logprob if (seq.logprobs is not None or beam) else None,
            logprobs=seq.logprobs,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        for seq in request.outputs_in_order()
    ]
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=outputs,
        finished=request.is_finished,
        num_cached_tokens=request.num_cached_tokens,
        prompt_logprobs=request.prompt_logprobs,
    )
