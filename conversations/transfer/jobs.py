"""Export and import jobs from the data page: create the job row, run it (in a task), and
record the outcome on the row for the page to show."""

from __future__ import annotations

import logging

from django.utils import timezone

from conversations.enqueue import RUN_EXPORT, RUN_IMPORT, enqueue_on_commit
from conversations.models import Conversation, DataJob, Message
from conversations.transfer import InvalidFile, export_json, export_markdown, parse_file, render_json
from conversations.transfer.saving import ImportStopped, save

log = logging.getLogger(__name__)

EXTENSIONS = {"json": "json", "markdown": "md"}


def message_count(owner) -> int:
    return Message.objects.filter(conversation__owner=owner, conversation__deleted_at__isnull=True).count()


def render_export(owner, fmt: str, conversation_id: int | None = None) -> bytes:
    """All of ``owner``'s conversations (or one) in ``fmt`` ("json" or "markdown")."""
    conversations = Conversation.objects.filter(owner=owner).order_by("created_at", "id")
    if conversation_id is not None:
        conversations = conversations.filter(pk=conversation_id)
    if fmt == "markdown":
        return export_markdown(conversations).encode()
    return render_json(export_json(conversations))


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
    job = _claim(job_id, DataJob.Kind.EXPORT)
    if job is None:
        return
    try:
        data = render_export(job.owner, job.format)
        count = Conversation.objects.filter(owner=job.owner).count()
    except Exception as exc:
        log.exception("export job %s failed", job_id)
        _fail(job, f"The export failed: {type(exc).__name__}.")
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
    job = _claim(job_id, DataJob.Kind.IMPORT)
    if job is None:
        return
    try:
        kind, specs = parse_file(bytes(job.payload or b""))
    except InvalidFile as exc:
        _fail(job, f"Nothing was imported: {exc}.")
        return
    except Exception as exc:
        log.exception("import job %s failed", job_id)
        _fail(job, f"Nothing was imported: the file could not be read ({type(exc).__name__}).")
        return
    DataJob.objects.filter(pk=job.pk).update(format=kind, payload=None, total=len(specs))

    def progress(conversations: int, messages: int) -> None:
        DataJob.objects.filter(pk=job.pk).update(conversations=conversations, messages=messages)

    try:
        ids = save(job.owner, specs, on_batch=progress)
    except ImportStopped as exc:
        log.exception("import job %s failed part way", job_id)
        _fail(
            job,
            f"The import failed ({type(exc.__cause__).__name__}) after {exc.kept:,} conversations; those were kept.",
            exc.kept,
        )
        return
    except Exception as exc:
        log.exception("import job %s failed", job_id)
        _fail(job, f"Nothing was imported: the import failed ({type(exc).__name__}).")
        return
    DataJob.objects.filter(pk=job.pk).update(
        status=DataJob.Status.DONE,
        conversations=len(ids),
        messages=sum(len(s.nodes) for s in specs),
        finished_at=timezone.now(),
    )
