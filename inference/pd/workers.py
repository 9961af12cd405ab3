"""The prefill worker processes: started, fed, watched and restarted.

- **Bounded queue.** A worker holds at most ``queue_size`` jobs; ``pick`` returns the
  least loaded worker that is up and has room, or None (backpressure: the engine then
  prefills the prompt itself rather than queue behind a busy worker).
- **Faults.** ``poll`` collects results and reports the request ids that are lost: all
  jobs of a worker that died (it is restarted), a job past its deadline (``timeout_s``
  after submission; the worker is told to abort it), and all jobs of a worker that has
  said nothing for ``timeout_s`` while holding an expired job (hung: killed and
  restarted). The engine prefills lost requests locally, so nothing is lost. Results
  that come back for a job no longer held (aborted, expired) are discarded, their
  shared memory unlinked.
- A dead worker's result queue is dropped unread (a process killed halfway through a
  write can leave a partial message in it), with the queues of a fresh process.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

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
from inference.pd.transfer import discard_all

logger = logging.getLogger(__name__)

RESTART_INTERVAL_S = 1.0  # a worker that keeps dying is restarted at most this often
# The worker process's entry point, named rather than imported: the worker runs an
# LLMEngine, and the LLMEngine is what starts workers, so the serving process never
# needs the worker's module (the spawned child imports it).
WORKER_ENTRY = ("inference.pd.worker", "run_worker")


def _worker_main(spec: WorkerSpec, jobs: Queue, results: Queue) -> None:
    module = importlib.import_module(WORKER_ENTRY[0])
    getattr(module, WORKER_ENTRY[1])(spec, jobs, results)


@dataclass(eq=False)
class WorkerHandle:
    index: int
    spec: WorkerSpec
    process: BaseProcess | None = None
    jobs: Queue | None = None
    results: Queue | None = None
    ready: bool = False
    inflight: dict[str, float] = field(default_factory=dict)  # request id -> deadline
    last_heard: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


@dataclass
class PoolCounters:
    submitted: int = 0
    completed: int = 0
    failed: int = 0  # the worker reported an error
    restarts: int = 0
    abort_acks: int = 0  # aborts the worker confirmed (it stopped the job)
    purge_acks: int = 0
    purged_blocks: int = 0  # blocks the workers dropped from their caches on a purge
    lost: dict[str, int] = field(default_factory=lambda: {"dead": 0, "timeout": 0, "hung": 0})


class WorkerPool:
    def __init__(
        self,
        specs: list[WorkerSpec],
        queue_size: int,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue_size = queue_size
        self.timeout_s = timeout_s
        self.clock = clock
        self.counters = PoolCounters()
        self._ctx = mp.get_context("spawn")
        self.workers = [WorkerHandle(i, spec) for i, spec in enumerate(specs)]
        for worker in self.workers:
            self._start(worker)

    # ---- life cycle -----------------------------------------------------------------
    def _start(self, worker: WorkerHandle) -> None:
        worker.jobs, worker.results = self._ctx.Queue(), self._ctx.Queue()
        worker.process = self._ctx.Process(
            target=_worker_main,
            args=(worker.spec, worker.jobs, worker.results),
            name=f"prefill-worker-{worker.index}",
            daemon=True,
        )
        worker.process.start()
        worker.ready, worker.pid = False, None
        worker.started_at = worker.last_heard = self.clock()

    def _restart(self, worker: WorkerHandle) -> None:
        if worker.process is not None and worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        for q in (worker.jobs, worker.results):
            if q is not None:
                q.cancel_join_thread()
                q.close()
        worker.restarts += 1
        self.counters.restarts += 1
        self._start(worker)

    def wait_ready(self, timeout: float) -> bool:
        """Block until every worker has loaded its model (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if all(w.ready for w in self.workers):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive and worker.jobs is not None:
                worker.jobs.put(None)
        for worker in self.workers:
            if worker.process is not None:
                worker.process.join(3)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join(3)
            if worker.results is not None:
                for message in _drain(worker.results):
                    if isinstance(message, PrefillDone):
                        discard_all(message.shm_name, message.state_shm_name)
            for q in (worker.jobs, worker.results):
                if q is not None:
                    q.cancel_join_thread()
                    q.close()
            worker.process = None

    # ---- jobs -----------------------------------------------------------------------
    def pick(self) -> WorkerHandle | None:
        """The least loaded worker that is up and has room, or None."""
        ready = [w for w in self.workers if w.ready and len(w.inflight) < self.queue_size and w.alive]
        return min(ready, key=lambda w: len(w.inflight)) if ready else None

    def submit(self, worker: WorkerHandle, job: PrefillJob) -> None:
        assert worker.jobs is not None
        now = self.clock()
        if not worker.inflight:
            worker.last_heard = now  # an idle worker's silence is no sign of a hang
        worker.inflight[job.request_id] = now + self.timeout_s
        worker.jobs.put(job)
        self.counters.submitted += 1

    def abort(self, request_id: str) -> bool:
        """Tell the worker holding ``request_id`` to stop it; False if none holds it."""
        for worker in self.workers:
            if worker.inflight.pop(request_id, None) is not None:
                if worker.alive and worker.jobs is not None:
                    worker.jobs.put(Abort(request_id))
                return True
        return False

    def purge(self, namespace: int) -> None:
        """Every live worker drops ``namespace``'s cached blocks (a dead one's cache died
        with it; a restarted one starts empty)."""
        for worker in self.workers:
            if worker.alive and worker.jobs is not None:
                worker.jobs.put(Purge(namespace))

    @property
    def queue_depth(self) -> int:
        return sum(len(w.inflight) for w in self.workers)

    def poll(self) -> tuple[list[PrefillDone | PrefillFailed], list[str]]:
        """(results of held jobs, request ids lost to a fault)."""
        results: list[PrefillDone | PrefillFailed] = []
        lost: list[str] = []
        now = self.clock()
        for worker in self.workers:
            if not worker.alive:
                if now - worker.started_at >= RESTART_INTERVAL_S:
                    logger.warning("prefill worker %d died; restarting it", worker.index)
                    lost += self._lose_all(worker, "dead")
                    self._restart(worker)
                continue
            assert worker.results is not None
            for message in _drain(worker.results):
                worker.last_heard = now
                self._receive(worker, message, results)
            expired = [rid for rid, deadline in worker.inflight.items() if deadline <= now]
            if expired and now - worker.last_heard >= self.timeout_s:
                logger.warning("prefill worker %d is not answering; restarting it", worker.index)
                lost += self._lose_all(worker, "hung")
                self._restart(worker)
                continue
            for rid in expired:
                self.abort(rid)
                self.counters.lost["timeout"] += 1
                lost.append(rid)
        return results, lost

    def _lose_all(self, worker: WorkerHandle, reason: str) -> list[str]:
        lost = list(worker.inflight)
        worker.inflight.clear()
        self.counters.lost[reason] += len(lost)
        return lost

    def _receive(self, worker: WorkerHandle, message: Any, results: list) -> None:
        if isinstance(message, Ready):
            worker.ready, worker.pid = True, message.pid
        elif isinstance(message, Aborted):
            self.counters.abort_acks += 1
        elif isinstance(message, Purged):
            self.counters.purge_acks += 1
            self.counters.purged_blocks += message.blocks
        elif isinstance(message, PrefillDone | PrefillFailed):
            if worker.inflight.pop(message.request_id, None) is None:
                if isinstance(message, PrefillDone):
                    discard_all(message.shm_name, message.state_shm_name)  # no longer wanted
                return
            if isinstance(message, PrefillFailed):
                self.counters.failed += 1
                logger.warning("prefill worker failed %s: %s", message.request_id, message.error)
            else:
                self.counters.completed += 1
            results.append(message)

    def stats(self) -> dict[str, Any]:
        return {
            "workers": len(self.workers),
            "workers_ready": sum(1 for w in self.workers if w.ready and w.alive),
            "queue_depth": self.queue_depth,
            "queue_capacity": self.queue_size * len(self.workers),
            "submitted": self.counters.submitted,
            "completed": self.counters.completed,
            "failed": self.counters.failed,
            "restarts": self.counters.restarts,
            "abort_acks": self.counters.abort_acks,
            "purge_acks": self.counters.purge_acks,
            "purged_blocks": self.counters.purged_blocks,
            "lost": dict(self.counters.lost),
        }


def _drain(results: Queue) -> list[Any]:
    out = []
    while True:
        try:
            out.append(results.get_nowait())
        except (queue.Empty, EOFError, OSError):
            return out
