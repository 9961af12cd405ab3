"""What the engine and its prefill workers send each other (pickled over queues)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.config import EngineConfig


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its engine: the serving engine's config (same model file, dtype,
    block size), its cores, and a delay per step (tests: a slow or hung worker)."""

    config: EngineConfig
    cpus: frozenset[int] | None = None
    step_delay_s: float = 0.0


@dataclass(frozen=True)
class PrefillJob:
    request_id: str
    token_ids: list[int]
    num_blocks: int  # full blocks wanted back (those wholly before the last prompt token)
    # The request's prefix-cache salt (inference.kv.salt): the worker's chained hashes
    # must be the ones the engine computes.
    cache_salt: int = 0
    cache_salt_block: int = 0
    cache_namespace: int = 0


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Purge:
    """Drop every cached block of this salt namespace root (a deleted user's)."""

    namespace: int


@dataclass(frozen=True)
class Purged:
    namespace: int
    blocks: int  # pool blocks the worker dropped


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class PrefillDone:
    """A prompt's blocks, in shared memory ``shm_name`` as ``[num_blocks, *pool[b].shape]``."""

    request_id: str
    shm_name: str | None  # None when no block was wanted
    num_blocks: int
    block_hashes: list[int]
    first_token: int
    nbytes: int
    prefill_s: float
    write_s: float
    # The (KV group, block index) of each shipped block, in order, for a model with several
    # KV groups (a sliding group ships the blocks of its last window only); empty: group
    # 0's blocks 0..num_blocks-1.
    block_groups: tuple[tuple[int, int], ...] = ()
    # A hybrid model's recurrent state after the shipped blocks (every recurrent layer's
    # conv and recurrent tensors, ``StateLayout.pack``'s bytes) in its own segment.
    state_shm_name: str | None = None
    state_nbytes: int = 0


@dataclass(frozen=True)
class PrefillFailed:
    request_id: str
    error: str


@dataclass(frozen=True)
class Aborted:
    request_id: str
