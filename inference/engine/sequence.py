"""State of requests and of the sequences (completions, beams) they run."""

from __future__ import annotations

import enum
import itertools
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.engine.token_budget import TokenGate
from inference.sampling.params import SamplingParams

_seq_ids = itertools.count()


class _WeakRequest:
    """A sequence's request, held weakly. A request holds its sequences; were the link back
    strong too, every finished request would be a reference cycle, freed only by a full
    garbage collection (a pause of the whole process that grows with the traffic since the
    last one). The engine and the scheduler hold a request for as long as its sequences run."""

    # A plain attribute holds the reference: reading the instance's ``__dict__`` would cost
    # every sequence its compact attribute layout, and every attribute read its speed.
    def __get__(self, seq: Sequence | None, owner: type | None = None) -> Request | None:
        if seq is None:  # the dataclass's default
            return None
        ref = seq._request_ref
        return None if ref is None else ref()

    def __set__(self, seq: Sequence, request: Request | None) -> None:
        # ``self`` is what the dataclass passes when no request is given.
        seq._request_ref = None if request is None or request is self else weakref.ref(request)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    LOADING_KV = "loading_kv"  # admitted, waiting for blocks read from a lower KV tier
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One token stream: the prompt plus one completion (or one beam).

    ``num_computed_tokens`` counts the leading tokens whose K/V are in the pool;
    the scheduler feeds ``token_ids[num_computed_tokens:]`` to the model. The last
    sampled token is never computed until the next step, so a running sequence
    always has at least one token to feed.
    """

    token_ids: list[int]
    num_prompt_tokens: int
    index: int = 0  # completion index within the request
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    request: Request | None = field(default=_WeakRequest(), repr=False)  # type: ignore[assignment]
    num_computed_tokens: int = 0
    # Block manager state: physical blocks, chained hashes of full blocks (a pure
    # function of token_ids, so kept across preemption), and how many leading
    # blocks are registered in the prefix cache.
    block_table: list[int] = field(default_factory=list)
    group_tables: list[list[int]] = field(default_factory=list)  # KV groups 1.. (sliding models)
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0
    state_slot: int = -1  # a hybrid model's recurrent-state slot while it holds one (inference.kv.state_pool)
    # Prefix-cache privacy: a non-zero salt is mixed into the chain hash from block
    # ``cache_salt_block`` on, so those blocks (and all after them) match only
    # sequences with the same salt; the blocks before stay shared by everyone.
    # ``cache_namespace`` is the salt's root (``inference.kv.salt``), kept with each
    # salted block; ``cache_private``: its namespace was purged while this ran, so its
    # blocks are no longer published to the prefix cache.
    cache_salt: int = 0
    cache_salt_block: int = 0
    cache_namespace: int = 0
    cache_private: bool = False
    # The LoRA adapter this sequence runs (``inference.lora``; None: the base model) and
    # its key, mixed into the hash chain's root so no block is shared across adapters.
    adapter: str | None = None
    adapter_key: int = 0
    pending_loads: list[Any] = field(default_factory=list)  # kv_tiers.Load, while loading KV
    # Sampling and output state.
    generator: torch.Generator | None = None
    cumulative_logprob: float = 0.0
    logprobs: list[dict[int, float]] | None = None
    output_text: str = ""
    detokenizer: Any = None  # IncrementalDetokenizer, created by the engine
    reasoning: Any = None  # ReasoningSplitter when the request separates reasoning
    grammar: Any = None  # inference.structured.SequenceGrammar when the output is constrained
    # Its request wants prompt logprobs not all computed yet: the runner scores its prompt
    # rows (inference.runner.prompt_scores) and the prefix cache is bypassed.
    score_prompt: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or token that ended it
    # Streaming cursors: what StreamDelta already handed out.
    num_emitted_tokens: int = 0
    num_emitted_chars: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def reset_for_recompute(self) -> None:
        """After preemption: nothing is cached any more (blocks already freed)."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.group_tables = []
        self.num_registered_blocks = 0
        self.pending_loads = []


@dataclass(eq=False)
class Request:
    """What a caller asked for: a prompt and its params, run as one or more sequences."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    # Who asked (a user, an API key): the scheduler admits waiting requests round-robin
    # across owners. None: FIFO among other unowned requests.
    owner: str | None = None
    # The owner's fair-share weight (seats per unit of weight decide admission).
    weight: float = 1.0
    # A token budget the engine charges each step's new tokens to (``inference.engine.token_gate``).
    token_gate: TokenGate | None = None
    charged_tokens: int = 0  # output tokens already charged to ``token_gate``
    # See Sequence.cache_salt; copied to every sequence of the request.
    cache_salt: int = 0
    cache_salt_block: int = 0
    cache_namespace: int = 0
    cache_private: bool = False
    # The LoRA adapter's name and key (see Sequence.adapter); copied to every sequence.
    adapter: str | None = None
    adapter_key: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    seqs: list[Sequence] = field(default_factory=list)  # live (unfinished) sequences
    finished_seqs: list[Sequence] = field(default_factory=list)
    forked: bool = False  # n > 1 / beams: the single prefill sequence has been split
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    # KV tiers: blocks were loaded for the current admission (one round per admission);
    # a preempted request whose cost model chose recompute does not load its blocks back.
    kv_loaded: bool = False
    skip_lower_tiers: bool = False
    num_loaded_tokens: int = 0  # prompt tokens served from lower tiers at first admission
    first_token_time: float | None = None
    finish_time: float | None = None
    beam_hyps: list[Sequence] = field(default_factory=list)  # beam search: finished hypotheses, best first
    beam_outputs: list[Sequence] | None = None  # beam search: the n best, in score order
    grammar: Any = None  # Future of the compiled grammar (params.grammar); not scheduled until done
    # params.prompt_logprobs: per prompt token, {token id: logprob} with its top ones (the
    # first token's entry is None); filled by the runner as the prefill runs.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_logprobs_sent: bool = False  # handed out with the request's first delta

    @property
    def grammar_pending(self) -> bool:
        return self.grammar is not None and not self.grammar.done()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def num_seats(self) -> int:
        """Sequence slots (max_num_seqs) this request holds or will hold once forked."""
        return len(self.seqs) if self.forked else self.params.width

    def outputs_in_order(self) -> list[Sequence]:
        if self.beam_outputs is not None:
            return self.beam_outputs
        return sorted(self.finished_seqs + self.seqs, key=lambda s: s.index)
