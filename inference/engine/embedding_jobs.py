"""Embedding requests as engine work budgeted like prefill: in chunks, between steps.

An embedding is a prefill whose hidden states are pooled (``inference.engine.pooling``).
Run whole between two steps, a request of 32,768 tokens froze every stream for the
seconds it took. Here the engine thread advances the embedding jobs by at most one chunk
per turn after a step; while requests run, a turn is paid from a hard share of the
engine's time and its chunk sized to that credit (``inference.engine.embedding_share``);
when nothing runs, a turn takes a full step's tokens:

- short inputs are packed whole into one forward over a fresh scratch pool, as before;
- an input longer than the chunk is carried across turns: its scratch pool is kept and
  each turn runs the next chunk of its tokens against the cached ones (a chunked
  prefill), summing the final hidden states for the mean. Deep in a long input each token
  attends to thousands of cached ones and costs several times a step's prompt token, so
  the next chunk is sized from the time the carried input's previous chunk took
  (``fit_chunk``), not from the step's prefill rate alone.

Jobs take turns across owners: the next chunk goes to the job of the owner served least
recently, so one user's many requests cannot starve another's. Each owner with a job in
progress holds one seat in the scheduler's fair share (``Scheduler.external_seats``), so
their chat requests are admitted after those of owners who are not embedding.

The queue is bounded in tokens, in all and per owner (``EmbeddingQueue.admit``:
``EngineOverloadedError`` past either).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.engine.pooling import _context, forward_mean_pooled
from inference.engine.step_budget import MIN_CHUNK
from inference.errors import EngineOverloadedError


@dataclass
class _Carry:
    """An input longer than a chunk, part-way through: its scratch pool and its sum."""

    index: int
    kv_cache: Any
    computed: int = 0
    total: torch.Tensor | None = None
    s_per_token: float | None = None  # what its latest chunk took, per token


@dataclass
class EmbedJob:
    inputs: list[list[int]]
    owner: str | None
    done: Future[Any]
    num_tokens: int = 0
    next_index: int = 0  # the first input not started
    carry: _Carry | None = None
    rows: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_tokens = sum(len(x) for x in self.inputs)
        self.rows = [None] * len(self.inputs)

    @property
    def finished(self) -> bool:
        return self.carry is None and self.next_index >= len(self.inputs)


class EmbeddingQueue:
    """The engine thread's embedding jobs; ``admit`` and ``release`` (the token counts)
    are thread-safe."""

    def __init__(self, max_tokens: int, max_tokens_per_owner: int) -> None:
        self._lock = threading.Lock()
        self.max_tokens = max_tokens
        self.max_tokens_per_owner = max_tokens_per_owner
        self.queued_tokens = 0
        self.queued_by_owner: dict[str | None, int] = {}
        # Owner -> its jobs in arrival order; the owner served least recently first.
        self._jobs: OrderedDict[str | None, list[EmbedJob]] = OrderedDict()

    # ---- any thread (under the caller's lock) ----------------------------------------------
    def admit(self, num_tokens: int, owner: str | None) -> None:
        """Count a job's tokens in, or raise ``EngineOverloadedError`` when the queue, or
        the owner's share of it, would be over its bound."""
        with self._lock:
            self._admit(num_tokens, owner)

    def _admit(self, num_tokens: int, owner: str | None) -> None:
        if self.queued_tokens + num_tokens > self.max_tokens:
            raise EngineOverloadedError(
                f"{self.queued_tokens} tokens are already waiting to be embedded (at most {self.max_tokens})"
            )
        mine = self.queued_by_owner.get(owner, 0)
        if owner is not None and mine + num_tokens > self.max_tokens_per_owner:
            raise EngineOverloadedError(
                f"this user already has {mine} tokens waiting to be embedded "
                f"(at most {self.max_tokens_per_owner} at once)"
            )
        self.queued_tokens += num_tokens
        self.queued_by_owner[owner] = mine + num_tokens

    def release(self, num_tokens: int, owner: str | None) -> None:
        with self._lock:
            self._release(num_tokens, owner)

    def _release(self, num_tokens: int, owner: str | None) -> None:
        self.queued_tokens -= num_tokens
        left = self.queued_by_owner.get(owner, 0) - num_tokens
        if left > 0:
            self.queued_by_owner[owner] = left
        else:
            self.queued_by_owner.pop(owner, None)

    # ---- engine thread ---------------------------------------------------------------------
    def add(self, job: EmbedJob) -> None:
        self._jobs.setdefault(job.owner, []).append(job)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def owners(self) -> dict[str | None, int]:
        """One fair-share seat per owner with a job in progress."""
        return dict.fromkeys(self._jobs, 1)

    def jobs(self) -> list[EmbedJob]:
        return [job for jobs in self._jobs.values() for job in jobs]

    def clear(self) -> list[EmbedJob]:
        jobs = self.jobs()
        self._jobs.clear()
        return jobs

    def next_job(self) -> EmbedJob | None:
        """The oldest job of the owner served least recently; that owner goes to the back."""
        for owner, jobs in self._jobs.items():
            self._jobs.move_to_end(owner)
            return jobs[0]
        return None

    def remove(self, job: EmbedJob) -> None:
        jobs = self._jobs.get(job.owner, [])
        if job in jobs:
            jobs.remove(job)
        if not jobs:
            self._jobs.pop(job.owner, None)


@torch.inference_mode()
def advance(job: EmbedJob, model: torch.nn.Module, tokens: int, *, block_size: int, device, dtype) -> int:
    """Run up to ``tokens`` of ``job``'s inputs through ``model``; the tokens run."""
    if job.carry is not None:
        return _continue(job, model, tokens, block_size, device)
    group: list[int] = []
    used = 0
    while job.next_index + len(group) < len(job.inputs):
        n = len(job.inputs[job.next_index + len(group)])
        if used + n > tokens:
            break
        group.append(job.next_index + len(group))
        used += n
    if group:
        vectors = forward_mean_pooled(model, [job.inputs[i] for i in group], block_size, device, dtype)
        for i, row in zip(group, vectors.cpu(), strict=True):
            job.rows[i] = row
        job.next_index += len(group)
        return used
    # The next input is longer than the chunk: start it, carried across turns.
    index = job.next_index
    job.next_index += 1
    blocks = -(-len(job.inputs[index]) // block_size)
    # Left unset (not zeroed): each chunk writes its tokens' slots before attending to
    # them, and attention reads no slot past the tokens computed. Zeroing a long input's
    # pool (hundreds of MB) took a whole turn on its own.
    shape = model.kv_spec.block_shape(block_size)
    job.carry = _Carry(index, torch.empty(blocks, *shape, dtype=dtype, device=device))
    return _continue(job, model, tokens, block_size, device)


def fit_chunk(job: EmbedJob, tokens: int, seconds: float | None) -> int:
    """``tokens`` cut so that the next chunk of ``job``'s carried input takes about
    ``seconds`` at the rate its previous chunk ran (at least ``MIN_CHUNK``: below that a
    forward's fixed cost, streaming every weight once, outweighs what fewer tokens save). Unchanged when nothing is carried or measured yet, or with no
    ``seconds`` to keep to."""
    carry = job.carry
    if carry is None or carry.s_per_token is None or seconds is None:
        return tokens
    return max(min(MIN_CHUNK, tokens), min(tokens, int(seconds / carry.s_per_token)))


def _continue(job: EmbedJob, model: torch.nn.Module, tokens: int, block_size: int, device) -> int:
    carry = job.carry
    assert carry is not None
    ids = job.inputs[carry.index]
    start = carry.computed
    n = min(max(1, tokens), len(ids) - start)
    blocks = -(-len(ids) // block_size)
    ctx = _context([start + n], block_size, device)
    # Only this chunk's tokens are new: the context covers the cached ones before it.
    ctx.slot_mapping = ctx.slot_mapping[start:]
    ctx.query_start_loc = torch.tensor([0, n], dtype=torch.int32, device=device)
    ctx.max_query_len = n
    ctx.block_tables = torch.tensor([list(range(blocks))], dtype=torch.int32, device=device)
    chunk = torch.tensor(ids[start : start + n], dtype=torch.int64, device=device)
    positions = torch.arange(start, start + n, dtype=torch.int64, device=device)
    started = time.perf_counter()
    hidden = model(chunk, positions, ctx, carry.kv_cache).float()
    part = hidden.sum(dim=0)
    if part.device.type == "cuda":
        torch.cuda.synchronize(part.device)  # the chunk's time, not its launch's
    carry.s_per_token = (time.perf_counter() - started) / n
    carry.total = part if carry.total is None else carry.total + part
    carry.computed += n
    if carry.computed == len(ids):
        mean = carry.total / len(ids)
        job.rows[carry.index] = torch.nn.functional.normalize(mean, p=2, dim=-1).cpu()
        job.carry = None  # its scratch pool goes with it
    return n


def result(job: EmbedJob) -> torch.Tensor:
    return torch.stack([row for row in job.rows if row is not None])
