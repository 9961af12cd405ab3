"""Uploads and their extraction job: caps checked at upload, then a Celery task reads the
text, chunks it and embeds the chunks, counting ``Document.progress`` up as it goes.

Under the embedded defaults (eager Celery) the job runs in a thread of the site process
after the upload commits, so the upload answers at once and the page can show progress.
A file that cannot be read fails alone: its row records the reason, nothing else changes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from conversations.accounts.access import access_for
from conversations.accounts.user_lock import lock_user
from conversations.documents.formats import DocumentError, kind_of
from conversations.documents.reading import Reading, passage_text, read, read_apart
from conversations.enqueue import RUN_DOCUMENT, enqueue_on_commit, tasks_run_here
from conversations.models import Document, DocumentChunk
from conversations.ops.window_counts import add_one

log = logging.getLogger(__name__)

EMBED_BATCH = 16
# A file still not read this long after its upload lost its job (a process or worker died).
STALE_SECONDS = 1800
UPLOAD_WINDOW_S = 3600  # DOCUMENT_UPLOADS_PER_HOUR counts in windows of this many seconds
# Shares of the progress bar: extraction, then chunking, then embedding.
EXTRACT_SHARE, CHUNK_SHARE = 0.5, 0.1


class UploadRateLimited(DocumentError):
    """Over the user's uploads per hour; ``retry_after``: seconds until the window ends."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def count_upload(owner) -> None:
    """Count an upload against the user's ``DOCUMENT_UPLOADS_PER_HOUR`` (0: no limit):
    each one is read and embedded in the background (a thread of the site process under
    eager Celery), so deleting and uploading again must not repeat that work freely."""
    limit = settings.DOCUMENT_UPLOADS_PER_HOUR
    if limit <= 0:
        return
    now = time.time()
    window = int(now // UPLOAD_WINDOW_S)
    # The join time too, to the microsecond: ids restart with a fresh database (and are reused
    # after a rolled-back transaction), a count's key must not.
    key = f"document-uploads:{owner.pk}:{owner.date_joined.timestamp():.6f}:{window}"
    if add_one(key, UPLOAD_WINDOW_S + 5) > limit:
        retry_after = max(1, int((window + 1) * UPLOAD_WINDOW_S - now + 0.999))
        raise UploadRateLimited(
            f"You have uploaded {limit} files in the last hour, the most allowed; "
            f"try again in {retry_after // 60 + 1} minutes.",
            retry_after,
        )


def check_caps(owner, filename: str, size: int) -> None:
    """``DocumentError`` when the file, or the user's library with it, is over its cap."""
    if size > settings.DOCUMENT_MAX_BYTES:
        raise DocumentError(
            f"{filename} is {size:,} bytes; a file may have at most {settings.DOCUMENT_MAX_BYTES:,}."
        )
    # The caps are the largest any of the owner's groups sets (the settings' without groups).
    access = access_for(owner.pk)
    mine = Document.objects.filter(owner=owner)
    if mine.count() >= access.document_max_files:
        raise DocumentError(
            f"You have {access.document_max_files} files already: delete some in Your files first."
        )
    used = mine.aggregate(total=Sum("size"))["total"] or 0
    if used + size > access.document_max_bytes:
        raise DocumentError(
            f"{filename} would take your files to {used + size:,} bytes; the limit is "
            f"{access.document_max_bytes:,}. Delete some in Your files first."
        )


@transaction.atomic
def start_upload(owner, filename: str, data: bytes) -> Document:
    """Check and store an upload, then start its extraction once the row commits. The
    user's row is locked first: uploads at once are checked against the caps one by one."""
    filename = (filename or "file").replace("\\", "/").rsplit("/", 1)[-1][:255] or "file"
    kind = kind_of(filename)
    lock_user(owner.pk)
    check_caps(owner, filename, len(data))
    document = Document.objects.create(
        owner=owner,
        filename=filename,
        kind=kind,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        payload=data,
    )
    if tasks_run_here():
        transaction.on_commit(lambda: _thread(document.pk))
    else:
        enqueue_on_commit(RUN_DOCUMENT, document.pk)
    return document


def fail_stale(owner) -> int:
    """Mark the user's files whose job was lost as failed, so no page waits on them forever."""
    cutoff = timezone.now() - timedelta(seconds=STALE_SECONDS)
    return Document.objects.filter(
        owner=owner, status__in=[Document.Status.PENDING, Document.Status.EXTRACTING], created_at__lt=cutoff
    ).update(
        status=Document.Status.FAILED,
        error="Reading this file did not finish (the server restarted?). Please upload it again.",
        payload=None,
        finished_at=timezone.now(),
    )


def _thread(document_id: int) -> None:
    def run() -> None:
        try:
            run_extraction(document_id)
        finally:
            connection.close()

    threading.Thread(target=run, name=f"document-{document_id}", daemon=True).start()


def _set(document_id: int, **fields) -> None:
    Document.objects.filter(pk=document_id).update(**fields)


def run_extraction(document_id: int) -> None:
    """The job: claim the pending row, read, chunk, embed, mark ready (or failed)."""
    claimed = Document.objects.filter(pk=document_id, status=Document.Status.PENDING).update(
        status=Document.Status.EXTRACTING, progress=0
    )
    if not claimed:
        return  # gone, or a redelivered task finds it taken
    document = Document.objects.get(pk=document_id)
    try:
        _extract_and_index(document)
    except DocumentError as exc:
        _set(
            document_id,
            status=Document.Status.FAILED,
            error=str(exc),
            payload=None,
            finished_at=timezone.now(),
        )
    except Exception as exc:
        log.exception("extracting document %s failed", document_id)
        _set(
            document_id,
            status=Document.Status.FAILED,
            error=f"{document.filename} could not be read ({type(exc).__name__}).",
            payload=None,
            finished_at=timezone.now(),
        )


def _progress(document_id: int, start: float, share: float):
    last = [-1]

    def report(fraction: float) -> None:
        percent = int(100 * (start + share * min(1.0, max(0.0, fraction))))
        if percent != last[0]:
            last[0] = percent
            _set(document_id, progress=percent)

    return report


def _extract_and_index(document: Document) -> None:
    reading, embedder = _read(document)
    chunks = reading.chunks
    _progress(document.pk, EXTRACT_SHARE, CHUNK_SHARE)(1.0)
    vectors = _embed_chunks(document.pk, document.owner_id, embedder, reading)
    rows = [
        DocumentChunk(
            document_id=document.pk, owner_id=document.owner_id, index=c.index, heading=c.heading[:300],
            text=c.text, start=c.start, end=c.end, num_tokens=c.num_tokens,
            embedding=vectors[i].astype("<f4").tobytes() if vectors is not None else None,
        )
        for i, c in enumerate(chunks)
    ]  # fmt: skip
    extracted = reading.extracted
    with transaction.atomic():
        DocumentChunk.objects.bulk_create(rows, batch_size=500)
        _set(
            document.pk, status=Document.Status.READY, progress=100, payload=None, text=extracted.text,
            pages=extracted.pages, num_tokens=reading.num_tokens, finished_at=timezone.now(),
            embedding_model=embedder.model_name if vectors is not None else "",
        )  # fmt: skip


def _read(document: Document):
    """The file read, chunked and counted, and the embedder for its passages (None: BM25
    only). With the engine's tokenizer the reading runs in a low-priority child process
    (``conversations.documents.reading``), off the server's interpreter."""
    from conversations.documents.embedder import get_embedder  # noqa: PLC0415 - may load a model

    try:
        embedder = get_embedder()
        tokenizer_json = embedder.tokenizer_json()
    except Exception:
        log.exception("no embedder: document %s gets BM25 only", document.pk)
        embedder, tokenizer_json = None, None
    data = bytes(document.payload or b"")
    options = {"max_pages": settings.DOCUMENT_MAX_PAGES}
    if tokenizer_json is not None:
        return read_apart(
            document.filename, document.kind, data, tokenizer_json=tokenizer_json,
            max_input_tokens=embedder.max_input_tokens, **options,
        ), embedder  # fmt: skip
    reading = read(
        document.filename, document.kind, data, progress=_progress(document.pk, 0.0, EXTRACT_SHARE),
        encode=embedder.encode if embedder is not None else None,
        max_input_tokens=embedder.max_input_tokens if embedder is not None else 0, **options,
    )  # fmt: skip
    return reading, embedder


def _embed_chunks(document_id: int, owner_id: int, embedder, reading: Reading):
    """The passages' vectors, embedded by the engine as the uploader's work (their fair share)."""
    if embedder is None or not reading.chunks:
        return None
    import numpy as np  # noqa: PLC0415

    inputs = reading.inputs or [
        embedder.truncate(embedder.encode(passage_text(c)) or [0]) for c in reading.chunks
    ]
    report = _progress(document_id, EXTRACT_SHARE + CHUNK_SHARE, 1 - EXTRACT_SHARE - CHUNK_SHARE)
    parts = []
    for first in range(0, len(inputs), EMBED_BATCH):
        parts.append(embedder.embed_ids(inputs[first : first + EMBED_BATCH], f"user:{owner_id}"))
        report((first + EMBED_BATCH) / len(inputs))
    return np.concatenate(parts)
