"""Celery tasks. Eager (run in the calling process) under the embedded defaults; a real
worker runs them when ``REDIS_URL`` is set (``celery -A chatsite worker`` and one
``celery -A chatsite beat`` for the housekeeping schedule).

Each task is a thin wrapper: the work is in plain functions (``conversations.chat.titles``,
``conversations.transfer``, ``conversations.chat.housekeeping``, ``conversations.transfer.jobs``)
that the tests call directly, and the site starts them by name (``conversations.enqueue``).
Nothing here imports the inference engine: a worker never loads a model.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from conversations import enqueue
from conversations.audit import retention
from conversations.chat import housekeeping, titles
from conversations.transfer import jobs as data_jobs

log = logging.getLogger(__name__)


@shared_task(name=enqueue.GENERATE_TITLE, bind=True, max_retries=None)
def generate_title(self, conversation_id: int) -> str | None:
    try:
        return titles.write_title(conversation_id, local_only=bool(self.request.is_eager))
    except titles.NoLiveEngine as exc:
        if self.request.is_eager:
            # Eager runs inside a site process: without its engine loaded there is nobody
            # to ask, and a synchronous retry would only block the caller.
            log.info("no title for conversation %s: %s", conversation_id, exc)
            return None
        log.info("no title for conversation %s yet (%s); retrying", conversation_id, exc)
        raise self.retry(
            exc=exc, countdown=settings.TITLE_RETRY_SECONDS, max_retries=settings.TITLE_MAX_RETRIES
        ) from exc
    except titles.TitleFailed as exc:
        log.warning("no title for conversation %s: %s", conversation_id, exc)
        return None


@shared_task(name=enqueue.RUN_EXPORT)
def run_export(job_id: int) -> None:
    data_jobs.run_export(job_id)


@shared_task(name=enqueue.RUN_IMPORT)
def run_import(job_id: int) -> None:
    data_jobs.run_import(job_id)


@shared_task(name=enqueue.RUN_DOCUMENT)
def run_document_extraction(document_id: int) -> None:
    from conversations.documents.jobs import run_extraction  # noqa: PLC0415 - loads pypdf/docx lazily

    run_extraction(document_id)


@shared_task
def interrupt_orphan_answers() -> int:
    return housekeeping.interrupt_orphan_answers()


@shared_task
def purge_deleted_conversations() -> int:
    return housekeeping.purge_deleted_conversations()


@shared_task
def purge_temporary_conversations() -> int:
    return housekeeping.purge_temporary_conversations()


@shared_task
def prune_api_requests() -> int:
    return housekeeping.prune_api_requests()


@shared_task
def prune_audit_log() -> int:
    return retention.prune_audit_log()


@shared_task
def prune_data_jobs() -> int:
    return housekeeping.prune_data_jobs()


@shared_task
def clear_expired_sessions() -> None:
    housekeeping.clear_expired_sessions()
