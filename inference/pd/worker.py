"""A prefill worker process: its own engine on the same weights, prefilling prompts it
is sent and handing their KV blocks back.

The worker loads the model from the serving engine's ``EngineConfig`` (the same model
file, dtype and block size, so its K/V are the ones the engine would compute), pins
itself to its cores, and loops: take jobs and aborts from its queue (blocking only when
idle), run one step of its engine, and for every prompt done copy its full blocks into
shared memory and send a ``PrefillDone`` with their chained hashes and the first sampled
token. Jobs that arrive together are prefilled in the same steps; an ``Abort`` between
steps stops a job at once, and a ``Purge`` drops a namespace's blocks from the worker's
own prefix cache. ``None`` on the queue ends the process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import time
from multiprocessing.queues import Queue
from typing import Any

import torch

from inference.engine.llm_engine import LLMEngine
from inference.engine.sequence import Request
from inference.engine.sequence_factory import make_private
from inference.kv.chain_hash import prefix_hashes
from inference.pd.affinity import pin
from inference.pd.messages import (
    Abort,
    Aborted,
    PrefillDone,
    PrefillFailed,
    PrefillJob,
    Purge,
    Purged,
    Ready,
    WorkerSpec,
)
from inference.pd.states import StateMissing, export_state
from inference.pd.transfer import write_blocks
from inference.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


def worker_config(spec: WorkerSpec, threads: int | None) -> Any:
    """The worker's engine: the serving config without the features that belong to the
    serving engine (workers, a step budget, KV tiers), with prefix caching on (the
    finished blocks are found by their hashes)."""
    return dataclasses.replace(
        spec.config,
        prefill_workers=0,
        step_budget_ms=0.0,
        enable_prefix_caching=True,
        kv_cpu_gb=0.0,
        kv_disk_dir=None,
        num_threads=threads or spec.config.num_threads,
    )


def run_worker(spec: WorkerSpec, jobs: Queue, results: Queue) -> None:
    """The process's entry point (``multiprocessing`` spawn target)."""
    threads = pin(spec.cpus)
    engine = LLMEngine(worker_config(spec, threads))
    results.put(Ready(os.getpid()))
    active: dict[str, tuple[Request, PrefillJob, float]] = {}
    while True:
        try:
            messages = _drain(jobs, block=not engine.has_unfinished())
        except (EOFError, OSError):
            return  # the engine's side is gone
        for message in messages:
            if message is None:
                engine.close()
                return
            _handle(engine, message, active, results)
        if not engine.has_unfinished():
            continue
        if spec.step_delay_s:
            time.sleep(spec.step_delay_s)
        for delta in engine.step():
            if delta.request_finished and delta.request_id in active:
                request, job, started = active.pop(delta.request_id)
                results.put(_finish(engine, request, job, started))


def _drain(jobs: Queue, block: bool) -> list[Any]:
    messages = [jobs.get()] if block else []
    while True:
        try:
            messages.append(jobs.get_nowait())
        except queue.Empty:
            return messages


def _handle(engine: LLMEngine, message: Any, active: dict, results: Queue) -> None:
    if isinstance(message, Abort):
        if active.pop(message.request_id, None) is not None:
            engine.abort(message.request_id)
            results.put(Aborted(message.request_id))
        return
    if isinstance(message, Purge):
        # The jobs still running in that namespace publish nothing more; the engine
        # refuses their blocks too (its own copies of the requests are private now).
        make_private(engine.requests.values(), message.namespace)
        results.put(Purged(message.namespace, engine.block_manager.purge_namespace(message.namespace)))
        return
    job: PrefillJob = message
    try:
        # Greedy, one token: the engine samples with the request's own parameters.
        request = engine.add_request(
            job.token_ids, SamplingParams(temperature=0.0, max_tokens=1), job.request_id
        )
    except Exception as exc:  # noqa: BLE001 - reported, the engine prefills it itself
        results.put(PrefillFailed(job.request_id, f"{type(exc).__name__}: {exc}"))
        return
    for target in (request, *request.seqs):
        target.cache_salt = job.cache_salt
        target.cache_salt_block = job.cache_salt_block
        target.cache_namespace = job.cache_namespace
    active[job.request_id] = (request, job, time.monotonic())


def _finish(
    engine: LLMEngine, request: Request, job: PrefillJob, started: float
) -> PrefillDone | PrefillFailed:
    seq = (request.finished_seqs or request.seqs)[0]
    if seq.num_tokens <= request.num_prompt_tokens:  # finished without a token (its pool was too small)
        return PrefillFailed(job.request_id, f"the worker finished it without a token ({seq.finish_reason})")
    bm = engine.block_manager
    bs = bm.block_size
    root = bm.hash_root  # the same model's, so the same as the engine's
    hashes = prefix_hashes(
        job.token_ids[: job.num_blocks * bs], bs, job.cache_salt, job.cache_salt_block, root
    )
    # Every group's blocks a prefix hit of the whole prompt needs (a sliding group's last window).
    shipped = [
        (g, i)
        for g in range(bm.num_groups)
        for i in range(bm.first_needed_block(g, len(hashes) * bs), len(hashes))
    ]
    block_ids = [bm.cached_block(hashes[i], g) for g, i in shipped]
    if any(b is None for b in block_ids):  # evicted in the step that finished it: a tiny pool
        return PrefillFailed(job.request_id, "the worker's pool no longer holds the prompt's blocks")
    prefill_s = time.monotonic() - started
    written = time.monotonic()
    try:  # a hybrid model's recurrent state after those blocks, before they are written
        state_name, state_nbytes = export_state(bm, hashes, job.token_ids[: len(hashes) * bs])
    except StateMissing as exc:
        return PrefillFailed(job.request_id, str(exc))
    name, nbytes = None, 0
    if block_ids:
        name, nbytes = write_blocks(engine.runner.kv_cache[torch.tensor(block_ids)])
    return PrefillDone(
        request_id=job.request_id,
        shm_name=name,
        num_blocks=len(block_ids),
        block_hashes=hashes,
        first_token=seq.token_ids[request.num_prompt_tokens],
        nbytes=nbytes,
        prefill_s=prefill_s,
        write_s=time.monotonic() - written,
        block_groups=tuple(shipped) if bm.num_groups > 1 or bm.windows[0] is not None else (),
        state_shm_name=state_name,
        state_nbytes=state_nbytes,
    )
