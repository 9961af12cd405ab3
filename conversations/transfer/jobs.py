"""Export and import jobs from the data page: create the job row, run it (in a task), and
record the outcome on the row for the page to show.

A shutdown cuts short the jobs this process runs (:func:`stop_running_jobs`, from another
thread): a job's next statement raises, a statement it is running is aborted (again and
again until the job lets go), and the job records itself failed. An import is cut between
statements of a batch; the batches it committed are then removed, so it leaves nothing behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from conversations.enqueue import RUN_EXPORT, RUN_IMPORT, enqueue_on_commit
from conversations.models import Conversation, DataJob, Message
from conversations.ops import stopping
from conversations.transfer import InvalidFile, export_json, export_markdown, parse_file, render_json
from conversations.transfer.importing import account_fields
from conversations.transfer.saving import ImportStopped, save
from conversations.transfer.workspace_fields import save_account_fields

log = logging.getLogger(__name__)

EXTENSIONS = {"json": "json", "markdown": "md"}
STOPPED = {
    DataJob.Kind.EXPORT: "The server stopped before the export was ready. Please start it again.",
    DataJob.Kind.IMPORT: "Nothing was imported: the server stopped during the import. Please import the file again.",
}
# How often a shutdown aborts the statement a job is running (one it starts raises at once).
INTERRUPT_EVERY_SECONDS = 0.05


def message_count(owner) -> int:
    return Message.objects.filter(conversation__owner=owner, conversation__deleted_at__isnull=True).count()


def render_export(owner, fmt: str, conversation_id: int | None = None) -> bytes:
    """All of ``owner``'s conversations (or one) in ``fmt`` ("json" or "markdown")."""
    # Temporary chats are not kept, so never exported.
    conversations = (
        Conversation.objects.filter(owner=owner, temporary=False)
        .select_related("folder")
        .order_by("created_at", "id")
    )
    if conversation_id is not None:
        conversations = conversations.filter(pk=conversation_id)
    if fmt == "markdown":
        return export_markdown(conversations).encode()
    return render_json(export_json(conversations, owner if conversation_id is None else None))


def start_export(owner, fmt: str) -> DataJob:
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    job = DataJob.objects.create(
        owner=owner, kind=DataJob.Kind.EXPORT, format=fmt, filename=f"conversations-{stamp}.{EXTENSIONS[fmt]}"
    )
    enqueue_on_commit(RUN_EXPORT, job.pk)
    return job


def start_import(owner, filename: str, raw: bytes) -> DataJob:
    job = DataJob.objects.create(owner=owner, kind=DataJob.Kind.IMPORT, filename=filename[:200], payload=raw)
    enqueue_on_commit(RUN_IMPORT, job.pk)
    return job


def _claim(job_id: int, kind: str) -> DataJob | None:
    """The pending job, marked running (a redelivered task finds it taken and does nothing)."""
    claimed = DataJob.objects.filter(pk=job_id, kind=kind, status=DataJob.Status.PENDING).update(
        status=DataJob.Status.RUNNING
    )
    return DataJob.objects.select_related("owner").get(pk=job_id) if claimed else None


def _fail(job: DataJob, error: str, kept: int = 0) -> None:
    DataJob.objects.filter(pk=job.pk).update(
        status=DataJob.Status.FAILED,
        error=error,
        payload=None,
        conversations=kept,
        messages=0,
        finished_at=timezone.now(),
    )


def run_export(job_id: int) -> None:
    with _running(job_id) as run:
        job = _claim(job_id, DataJob.Kind.EXPORT)
        if job is None:
            return
        try:
            with run.cuttable():
                data = render_export(job.owner, job.format)
                count = Conversation.objects.filter(owner=job.owner).count()
        except Exception as exc:
            _fail(job, _failure(job, exc, f"The export failed: {type(exc).__name__}."))
            return
        DataJob.objects.filter(pk=job.pk).update(
            status=DataJob.Status.DONE,
            payload=data,
            conversations=count,
            messages=message_count(job.owner),
            finished_at=timezone.now(),
        )


def run_import(job_id: int) -> None:
    """Read the file, then write it batch by batch, counting up on the job as batches commit."""
    with _running(job_id) as run:
        job = _claim(job_id, DataJob.Kind.IMPORT)
        if job is None:
            return
        try:
            raw = bytes(job.payload or b"")
            kind, specs = parse_file(raw)
            # Folders and prompt presets of our own files.
            account = account_fields(raw) if kind == "ours" else {}
        except InvalidFile as exc:
            _fail(job, f"Nothing was imported: {exc}.")
            return
        except Exception as exc:
            _fail(
                job,
                _failure(
                    job, exc, f"Nothing was imported: the file could not be read ({type(exc).__name__})."
                ),
            )
            return
        DataJob.objects.filter(pk=job.pk).update(format=kind, payload=None, total=len(specs))

        def progress(conversations: int, messages: int) -> None:
            DataJob.objects.filter(pk=job.pk).update(conversations=conversations, messages=messages)

        try:
            # Only the batches' writes may be cut short: removing what was written after a
            # failure, and the job's outcome, must still reach the database.
            ids = save(job.owner, specs, on_batch=progress, guard=run.cuttable)
            save_account_fields(job.owner, account)
        except ImportStopped as exc:
            kept = f"The import failed ({type(exc.__cause__).__name__}) after {exc.kept:,} conversations; those were kept."
            _fail(job, _failure(job, exc, kept), exc.kept)
            return
        except Exception as exc:
            _fail(job, _failure(job, exc, f"Nothing was imported: the import failed ({type(exc).__name__})."))
            return
        DataJob.objects.filter(pk=job.pk).update(
            status=DataJob.Status.DONE,
            conversations=len(ids),
            messages=sum(len(s.nodes) for s in specs),
            finished_at=timezone.now(),
        )


def _failure(job: DataJob, exc: Exception, message: str) -> str:
    """The error to record: ``message``, or the shutdown's when one cut the job short."""
    global _cut
    if stopping.is_stopping():
        with _runs_lock:
            _cut += 1
        return STOPPED[job.kind]
    log.exception("%s job %s failed", job.kind, job.pk, exc_info=exc)
    return message


# --- Cut short at shutdown -----------------------------------------------------------------


class ShuttingDown(Exception):
    """The process is shutting down: the job is not started."""


@dataclass(eq=False)
class _Run:
    """A job running in this process, as a shutdown sees it."""

    job_id: int
    connection: Any  # the running thread's DatabaseWrapper
    lock: threading.Lock = field(default_factory=threading.Lock)
    cut_allowed: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def cuttable(self) -> Iterator[None]:
        """A shutdown may cut the block short (none of the statements after it): the next
        statement raises :class:`ShuttingDown`, and one running is aborted."""
        with self.lock:
            if stopping.is_stopping():
                raise ShuttingDown
            self.cut_allowed = True
        try:
            with self.connection.execute_wrapper(self._cut_when_stopping):
                yield
        finally:
            with self.lock:
                self.cut_allowed = False

    def _cut_when_stopping(self, execute, sql, params, many, context):
        with self.lock:
            if self.cut_allowed and stopping.is_stopping():
                self.cut_allowed = False  # one cut: the rollbacks that follow run
                raise ShuttingDown
        return execute(sql, params, many, context)


_runs: dict[int, _Run] = {}
_runs_lock = threading.Lock()
_cut = 0  # jobs a shutdown cut short


@contextmanager
def _running(job_id: int) -> Iterator[_Run]:
    run = _Run(job_id, connections[DEFAULT_DB_ALIAS])
    with _runs_lock:
        _runs[job_id] = run
    try:
        yield run
    finally:
        with _runs_lock:
            _runs.pop(job_id, None)
        run.finished.set()


def stop_running_jobs(timeout: float) -> int:
    """At shutdown, in a thread of its own: cut short the jobs this process runs, waiting for
    them at most ``timeout`` seconds. Returns how many were cut short (some may have seen the
    shutdown and stopped before this started). A job that did not let go in time is recorded
    failed here (its transaction, if any, dies with the process)."""
    with _runs_lock:
        runs = list(_runs.values())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(run.finished.is_set() for run in runs):
        for run in runs:
            with run.lock:
                if run.cut_allowed:
                    _abort_statement(run.connection)
        time.sleep(INTERRUPT_EVERY_SECONDS)
    stuck = [run.job_id for run in runs if not run.finished.is_set()]
    for kind, error in STOPPED.items() if stuck else ():
        DataJob.objects.filter(pk__in=stuck, kind=kind, status=DataJob.Status.RUNNING).update(
            status=DataJob.Status.FAILED, error=error, payload=None, finished_at=timezone.now()
        )
    with _runs_lock:
        return _cut + len(stuck)


def _abort_statement(connection: Any) -> None:
    """Abort the statement another thread runs on ``connection``, if it runs one (both
    drivers' calls are made to be called from another thread)."""
    raw = connection.connection
    try:
        if raw is None:
            return
        if connection.vendor == "sqlite":
            raw.interrupt()
        elif connection.vendor == "postgresql":
            raw.cancel_safe(timeout=1.0)
    except Exception:
        log.debug("could not abort a job's statement", exc_info=True)
