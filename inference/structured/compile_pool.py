"""Grammar compiles in worker processes that are killed when a compile runs too long.

xgrammar compiles in C++ and cannot be interrupted: a compile run in a thread keeps its
thread (and a core, and its memory) until it ends, however long after its caller gave
up. Here each compile runs in a worker process; when it is still running
``time_limit`` seconds after it started, the process is killed and a fresh one takes the
next job. A worker dies with its parent (``PR_SET_PDEATHSIG``), so a server killed
mid-compile leaves nothing running.

Workers run at a lower CPU priority (``WORKER_NICE``) than the server, so a compile that
runs to its time limit takes its share of the cores from nothing the streams need; there
are at most as many as the cores the server may use.

The queue in front of the workers is bounded (``GrammarBusyError`` past it), and so is
the number of compiles one owner may have queued or running at once. A cancelled job
that has not started yet is dropped.

Workers start on first use (a clean interpreter, not a fork of a process with threads
and torch state) and compile with the parent's tokenizer data, sent once at start; the compiled grammar comes back serialised (``CompiledGrammar.serialize_json``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from inference.structured.compile_worker import GrammarError

logger = logging.getLogger(__name__)

# The priority drops before anything is imported: loading xgrammar (and torch with it) takes
# seconds of CPU too. Linux groups a session's processes (autogroup), so the nice value weighs
# a worker against the server that started it (its engine thread first), not the whole machine.
_WORKER_MAIN = (
    "import os, sys; os.nice(int(sys.argv[2])); "
    "from inference.structured.compile_worker import main; main(int(sys.argv[1]))"
)
WORKER_NICE = 10  # CFS weight 110 against the engine thread's 1024: a compile takes about a tenth of a core
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the inference package

_STOP = object()
_POLL_S = 0.05  # a waiting caller checks its job's progress this often


def usable_cpus() -> int:
    """The cores this process may run on (its affinity where the platform says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class GrammarBusyError(RuntimeError):
    """The compile queue, or the owner's share of it, is full: try again later."""


class PoolClosedError(RuntimeError):
    """The pool was closed (the engine is shutting down) before the compile finished."""


# Seconds a new worker may take to load xgrammar (and torch) before it counts as failed.
STARTUP_LIMIT_S = 120.0


@dataclass
class _Job:
    kind: str
    source: str
    future: Future[Any]
    owner: str | None
    compile_started: float | None = None  # sent to a ready worker then


class CompilePool:
    def __init__(
        self,
        info_json: Callable[[], str],
        finish: Callable[[str, str], Any],
        *,
        workers: int = 2,
        max_queue: int = 16,
        max_per_owner: int = 2,
        time_limit: float | None = 10.0,
    ) -> None:
        """``info_json``: the tokenizer data for the workers (xgrammar's
        ``TokenizerInfo.serialize_json``), asked for when the first worker starts;
        ``finish(kind, serialized)``: the parent's compiled grammar from a worker's answer
        (its exceptions fail the job). ``max_queue``: jobs waiting for a worker beyond
        those running; ``max_per_owner``: an owner's jobs queued or running."""
        self._info_json = info_json
        self._finish = finish
        # More compiling processes than cores would only take turns with the engine.
        self.workers = max(1, min(workers, usable_cpus()))
        self.max_queue = max_queue
        self.max_per_owner = max_per_owner
        self.time_limit = time_limit
        self._lock = threading.Lock()
        self._jobs: queue.Queue[_Job | object] = queue.Queue()
        self._in_flight = 0  # queued or running
        self._per_owner: dict[str | None, int] = {}
        self._slots: list[_Slot] = []
        self._info: str | None = None
        self._info_lock = threading.Lock()  # apart: building the data takes seconds
        self._closed = False
        self.kills = 0  # compiles stopped at the time limit
        self.spawning = 0  # worker processes starting now

    def submit(
        self, kind: str, source: str, owner: str | None = None, *, bounded: bool = True
    ) -> Future[Any]:
        """A future of the compiled grammar. ``bounded``: refuse (``GrammarBusyError``) when
        the queue or ``owner``'s share is full; the engine's own submits, for requests
        already admitted, are not refused."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise PoolClosedError("the grammar compile pool is closed")
            if bounded:
                if self._in_flight >= self.workers + self.max_queue:
                    raise GrammarBusyError(
                        f"{self._in_flight} grammars are compiling or waiting to; try again shortly"
                    )
                if owner is not None and self._per_owner.get(owner, 0) >= self.max_per_owner:
                    raise GrammarBusyError(
                        f"at most {self.max_per_owner} grammar compiles per user may run at once; "
                        "wait for yours to finish"
                    )
            self._in_flight += 1
            self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
            if len(self._slots) < min(self.workers, self._in_flight):
                slot = _Slot(self, len(self._slots))
                self._slots.append(slot)
                slot.start()
        future.add_done_callback(lambda _f: self._done(owner))
        job = _Job(kind, source, future, owner)
        future.job = job  # type: ignore[attr-defined] - for wait()
        self._jobs.put(job)
        return future

    def wait(self, future: Future[Any], timeout: float) -> Any:
        """``future``'s grammar, waiting at most ``timeout`` seconds of its compile and
        ``timeout`` seconds in the queue; time while a worker process starts (loading
        xgrammar takes seconds) counts as neither. ``FutureTimeout`` past that, the job
        cancelled if it had not started."""
        job: _Job | None = getattr(future, "job", None)
        queued_s, last = 0.0, time.monotonic()
        while True:
            try:
                return future.result(_POLL_S)
            except FutureTimeout:
                now = time.monotonic()
                step, last = now - last, now
                if job is None:
                    queued_s += step
                    if queued_s > timeout:
                        raise
                    continue
                started = job.compile_started
                if started is not None:
                    if now - started > timeout:
                        raise
                elif not self.spawning:
                    queued_s += step
                    if queued_s > timeout:
                        future.cancel()
                        raise

    def _done(self, owner: str | None) -> None:
        with self._lock:
            self._in_flight -= 1
            left = self._per_owner.get(owner, 0) - 1
            if left > 0:
                self._per_owner[owner] = left
            else:
                self._per_owner.pop(owner, None)

    def prepare(self) -> None:
        """Build the workers' tokenizer data and start the first worker now (blocking: seconds
        of CPU), so that the first compile, perhaps while streams run, pays for neither. A
        server calls it in the background as it starts."""
        self.info()
        with self._lock:
            if self._closed or self._slots:
                return
            slot = _Slot(self, 0)
            self._slots.append(slot)
        try:
            slot.ensure_process()
        except (OSError, EOFError) as exc:  # the slot's first job tries again
            logger.warning("the grammar worker did not start ahead of use: %s", exc)
            slot.kill()
        slot.start()

    def info(self) -> str:
        with self._info_lock:
            if self._info is None:
                self._info = self._info_json()
            return self._info

    def close(self) -> None:
        """Kill the workers now; jobs not finished fail."""
        with self._lock:
            self._closed = True
            slots = list(self._slots)
        for _ in slots:
            self._jobs.put(_STOP)
        for slot in slots:
            slot.kill()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, _Job) and job.future.set_running_or_notify_cancel():
                job.future.set_exception(PoolClosedError("the grammar compile pool closed"))

    @property
    def closed(self) -> bool:
        return self._closed


class _Slot:
    """One worker process and the thread that feeds it, one job at a time."""

    def __init__(self, pool: CompilePool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self._thread = threading.Thread(target=self._run, name=f"grammar-{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> None:
        """A fresh interpreter running ``compile_worker`` (unlike multiprocessing's spawn,
        it never re-imports the parent's ``__main__``), talking over a socket pair."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_MAIN, str(theirs.fileno()), str(WORKER_NICE)],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        self.process, self.conn = process, conn
        conn.send(self.pool.info())
        if not conn.poll(STARTUP_LIMIT_S):
            raise OSError(f"the grammar worker did not start within {STARTUP_LIMIT_S:g} s")
        conn.recv()  # ("ready", "")

    def ensure_process(self) -> None:
        """A live worker process, started when there is none (or it died)."""
        if self.process is not None and self.process.poll() is None:
            return
        self.kill()
        with self.pool._lock:
            self.pool.spawning += 1
        try:
            self._spawn()
        finally:
            with self.pool._lock:
                self.pool.spawning -= 1

    def kill(self) -> None:
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is not None:
            with contextlib.suppress(Exception):
                process.kill()
                process.wait(1)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self) -> None:
        pool = self.pool
        while True:
            job = pool._jobs.get()
            if job is _STOP or pool.closed:
                if isinstance(job, _Job) and job.future.set_running_or_notify_cancel():
                    job.future.set_exception(PoolClosedError("the grammar compile pool closed"))
                return
            assert isinstance(job, _Job)
            if not job.future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                job.future.set_result(self._compile(job))
            except BaseException as exc:  # the job's failure, never the slot's
                job.future.set_exception(exc)

    def _compile(self, job: _Job) -> Any:
        try:
            self.ensure_process()
            assert self.conn is not None
            job.compile_started = time.monotonic()
            self.conn.send((job.kind, job.source))
            limit = self.pool.time_limit
            if not self.conn.poll(limit):
                self.kill()
                self.pool.kills += 1
                raise GrammarError(f"the grammar did not compile within {limit:g} s")
            status, payload = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            self.kill()
            if self.pool.closed:  # killed by close(), mid-compile or mid-start
                raise PoolClosedError("the grammar compile pool closed") from exc
            raise GrammarError("the grammar compiler stopped (out of memory?)") from exc
        if status == "error":
            raise GrammarError(payload)
        return self.pool._finish(job.kind, payload)
