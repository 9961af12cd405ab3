"""The scheduler of a serving engine with prefill workers: long prompts are prefilled
elsewhere and come back as prefix-cache hits.

``add`` sends a single-sequence request whose uncached prompt part is longer than
``min_prompt_tokens`` to a worker (``inference.pd.workers``) when one has room, and keeps
it aside (``remote``) meanwhile; every other request is scheduled as before. At each
``schedule`` the finished prompts are imported: their blocks, checked against the
chained hashes the engine computes itself, are copied from shared memory into free
pool blocks registered in the prefix cache (retained until the request is admitted, so
nothing evicts them first), and the request joins the waiting queue. Its admission is
then an ordinary prefix hit: the engine computes only the prompt's last partial block
(the last token must run anyway for its logits) and samples the first token with the
request's own parameters, stop rules and seed; the worker's greedy first token is kept
in ``first_tokens`` as a check. Requests lost to a worker fault, or a worker's error,
are prefilled here instead (``fallbacks``); an abort is forwarded to the worker.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.sequence import Request, RequestStatus
from inference.engine.step_budget import StepBudget
from inference.kv.block_manager import BlockManager, block_namespace
from inference.kv.chain_hash import prefix_hashes, salted_parent
from inference.pd.messages import PrefillDone, PrefillFailed, PrefillJob
from inference.pd.states import import_state
from inference.pd.transfer import MappedBlocks, discard_all
from inference.pd.workers import WorkerPool

IDLE_POLL_S = 0.005  # nothing to run but prompts out at workers: look again this soon
FIRST_TOKENS_KEPT = 256


@dataclass
class TransferCounters:
    requests: int = 0  # prompts imported from a worker
    tokens: int = 0  # prompt tokens whose blocks were imported
    bytes: int = 0
    seconds: float = 0.0  # the worker's copy into shared memory plus the copy into the pool
    worker_prefill_s: float = 0.0
    local_busy: int = 0  # long prompts prefilled here because every worker queue was full
    fallbacks: dict[str, int] = field(default_factory=lambda: {"error": 0, "mismatch": 0})


class DisaggregatedScheduler(Scheduler):
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        *,
        kv_cache: torch.Tensor,
        workers: WorkerPool,
        min_prompt_tokens: int,
        step_budget: StepBudget | None = None,
    ) -> None:
        """``kv_cache`` is the pool the imported blocks are copied into; ``workers`` are
        started already (``inference.pd.start_prefill_workers``)."""
        super().__init__(
            block_manager, max_num_batched_tokens, max_num_seqs, max_model_len, step_budget=step_budget
        )
        self.kv_cache = kv_cache
        self.workers = workers
        self.min_prompt_tokens = min_prompt_tokens
        self.remote: dict[str, Request] = {}  # out at a worker
        self._imported: dict[str, Request] = {}  # blocks imported, retained until admitted
        self.first_tokens: OrderedDict[str, int] = OrderedDict()
        self.transfer = TransferCounters()

    # ---- requests -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        if not self._offload(request):
            super().add(request)

    def _offload(self, request: Request) -> bool:
        if len(request.seqs) != 1 or request.params.width != 1 or request.num_preemptions:
            return False
        seq = request.seqs[0]
        if seq.cache_private or seq.score_prompt or not self.block_manager.enable_prefix_caching:
            return False
        self.check_prompt(request.num_prompt_tokens)
        bs = self.block_manager.block_size
        if seq.adapter_key:  # a worker serves its base model alone
            return False
        uncached = request.num_prompt_tokens - len(self.block_manager.match_prefix(seq)) * bs
        if uncached <= self.min_prompt_tokens:
            return False
        worker = self.workers.pick()
        if worker is None:
            self.transfer.local_busy += 1
            return False
        job = PrefillJob(
            request.request_id,
            list(request.prompt_token_ids),
            (request.num_prompt_tokens - 1) // bs,
            seq.cache_salt,
            seq.cache_salt_block,
            seq.cache_namespace,
        )
        self.workers.submit(worker, job)
        self.remote[request.request_id] = request
        return True

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.remote)

    def abort(self, request: Request) -> None:
        if self.remote.pop(request.request_id, None) is not None:
            self.workers.abort(request.request_id)
        self._release_import(request.request_id)
        super().abort(request)

    # ---- one step -------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        self._poll()
        batch = super().schedule()
        for request_id, request in list(self._imported.items()):
            if request.status is not RequestStatus.WAITING:
                self._release_import(request_id)
        if not batch.seqs and self.remote:
            time.sleep(IDLE_POLL_S)  # only prompts at workers: do not spin
        return batch

    def _poll(self) -> None:
        results, lost = self.workers.poll()
        for request_id in lost:
            self._local(self.remote.pop(request_id, None))
        for result in results:
            request = self.remote.pop(result.request_id, None)
            if request is None:
                if isinstance(result, PrefillDone):
                    discard_all(result.shm_name, result.state_shm_name)
                continue
            if isinstance(result, PrefillFailed):
                self.transfer.fallbacks["error"] += 1
            else:
                self._import(request, result)
            self._local(request)

    def _local(self, request: Request | None) -> None:
        """Into the waiting queue: an imported prompt (a prefix hit now) or a fallback."""
        if request is not None and request.status is RequestStatus.WAITING:
            super().add(request)

    def _import(self, request: Request, result: PrefillDone) -> None:
        seq, bm = request.seqs[0], self.block_manager
        bs, n = bm.block_size, len(result.block_hashes)  # the prefix's blocks (one group's)
        started = time.monotonic()
        root = bm.seq_root(seq)
        hashes = prefix_hashes(seq.token_ids[: n * bs], bs, seq.cache_salt, seq.cache_salt_block, root)
        if hashes != result.block_hashes or seq.cache_private:
            discard_all(result.shm_name, result.state_shm_name)
            self.transfer.fallbacks["mismatch"] += 1
            return
        self._remember_first_token(request.request_id, result.first_token)
        if result.shm_name is None:
            discard_all(result.state_shm_name)
            return
        pool = self.kv_cache
        mapped = MappedBlocks(result.shm_name, result.num_blocks, tuple(pool.shape[1:]), pool.dtype)
        shipped = result.block_groups or tuple((0, i) for i in range(n))
        try:
            bm.retain(
                _key(request.request_id),
                seq.token_ids[: n * bs],
                seq.cache_salt,
                seq.cache_salt_block,
                seq.adapter_key,
            )
            self._imported[request.request_id] = request
            for j, (group, i) in enumerate(shipped):
                parent = salted_parent(hashes, i, seq.cache_salt, seq.cache_salt_block, root)
                tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                bm.import_block(
                    hashes[i],
                    parent,
                    tokens,
                    block_namespace(seq, i),
                    lambda b, j=j: pool[b].copy_(mapped.blocks[j]),
                    group=group,
                )
        finally:
            mapped.close()
        import_state(bm, hashes, seq, result)
        t = self.transfer
        t.requests, t.tokens, t.bytes = t.requests + 1, t.tokens + n * bs, t.bytes + result.nbytes
        t.seconds += result.write_s + time.monotonic() - started
        t.worker_prefill_s += result.prefill_s

    def _remember_first_token(self, request_id: str, token: int) -> None:
        self.first_tokens[request_id] = token
        while len(self.first_tokens) > FIRST_TOKENS_KEPT:
            self.first_tokens.popitem(last=False)

    def _release_import(self, request_id: str) -> None:
        if self._imported.pop(request_id, None) is not None:
            self.block_manager.release(_key(request_id))

    # ---- life cycle and figures -----------------------------------------------------
    def close(self) -> None:
        self.workers.close()

    def purge_namespace(self, namespace: int) -> None:
        self.workers.purge(namespace)

    def disaggregation_stats(self) -> dict[str, Any]:
        t = self.transfer
        pool = self.workers.stats()
        fallbacks = {**pool.pop("lost"), **t.fallbacks}
        return {
            **pool,
            "remote": len(self.remote),
            "min_prompt_tokens": self.min_prompt_tokens,
            "imported_requests": t.requests,
            "transfer_tokens": t.tokens,
            "transfer_bytes": t.bytes,
            "transfer_s": t.seconds,
            "transfer_us_per_token": 1e6 * t.seconds / t.tokens if t.tokens else 0.0,
            "worker_prefill_s": t.worker_prefill_s,
            "local_busy": t.local_busy,
            "fallbacks": fallbacks,
            "fallbacks_total": sum(fallbacks.values()),
        }


def _key(request_id: str) -> str:
    return f"pd:{request_id}"
