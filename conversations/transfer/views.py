"""The data page (``/settings/data/``: export everything, import a file, the jobs' state) and
the per-conversation downloads (``/conversations/<id>/export.json`` and ``.md``).

Server-rendered with no scripts: a page with unfinished jobs reloads itself (a meta refresh)
until they are done.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_POST

from conversations.audit.log import Action, record
from conversations.models import Conversation, DataJob
from conversations.transfer import jobs as data_jobs
from conversations.transfer.upload_limit import ImportSizeLimit, announced_size

RECENT_JOBS = 20


def _download(body: bytes, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"
    return response


def _slug(title: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:60]
    return slug or "conversation"


def _export_one(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    # A temporary chat is not kept, so it has no export either.
    conversation = get_object_or_404(Conversation, pk=pk, owner=request.user, temporary=False)
    body = data_jobs.render_export(request.user, fmt, conversation_id=conversation.pk)
    with transaction.atomic():
        record(Action.EXPORT, target=conversation, request=request, detail={"format": fmt})
    extension = data_jobs.EXTENSIONS[fmt]
    content_type = "text/markdown; charset=utf-8" if fmt == "markdown" else "application/json"
    return _download(body, f"{_slug(conversation.title)}-{pk}.{extension}", content_type)


@require_GET
@login_required
def export_conversation_json(request: HttpRequest, pk: int) -> HttpResponse:
    return _export_one(request, pk, "json")


@require_GET
@login_required
def export_conversation_markdown(request: HttpRequest, pk: int) -> HttpResponse:
    return _export_one(request, pk, "markdown")


@never_cache
@login_required
def data_page(request: HttpRequest) -> HttpResponse:
    jobs = list(DataJob.objects.filter(owner=request.user).defer("payload")[:RECENT_JOBS])
    context = {
        "jobs": jobs,
        "busy": any(j.status in (DataJob.Status.PENDING, DataJob.Status.RUNNING) for j in jobs),
        "conversation_count": Conversation.objects.filter(owner=request.user).count(),
        "import_max_mb": settings.IMPORT_MAX_BYTES / 1_000_000,
        "import_max_conversations": f"{settings.IMPORT_MAX_CONVERSATIONS:,}",
    }
    return render(request, "conversations/data.html", context)


@require_POST
@login_required
def export_all(request: HttpRequest) -> HttpResponse:
    fmt = request.POST.get("format", "json")
    if fmt not in data_jobs.EXTENSIONS:
        messages.error(request, "Choose JSON or Markdown.")
        return redirect("data")
    if data_jobs.message_count(request.user) <= settings.EXPORT_INLINE_MAX_MESSAGES:
        body = data_jobs.render_export(request.user, fmt)
        with transaction.atomic():
            record(Action.EXPORT, request=request, detail={"format": fmt, "scope": "all"})
        content_type = "text/markdown; charset=utf-8" if fmt == "markdown" else "application/json"
        return _download(body, f"conversations.{data_jobs.EXTENSIONS[fmt]}", content_type)
    with transaction.atomic():
        job = data_jobs.start_export(request.user, fmt)
        record(Action.EXPORT, target=job, request=request, detail={"format": fmt, "scope": "all"})
    messages.info(request, "Your export is being prepared. It will be listed below when it is ready.")
    return redirect("data")


@csrf_exempt  # checked by _import_upload, once the size limit is among the upload handlers
@require_POST
@login_required
def import_file(request: HttpRequest) -> HttpResponse:
    # Refused on its announced length before the body is touched, or while Django reads it.
    limit = settings.IMPORT_MAX_BYTES
    if announced_size(request) > limit + settings.IMPORT_FORM_OVERHEAD_BYTES:
        return _too_large(request)
    counter = ImportSizeLimit(request, limit)
    request.upload_handlers.insert(0, counter)
    return _import_upload(request, counter)


@csrf_protect
def _import_upload(request: HttpRequest, counter: ImportSizeLimit) -> HttpResponse:
    upload = request.FILES.get("file")
    if counter.refused:
        return _too_large(request)
    if upload is None:
        messages.error(request, "Choose a file to import.")
        return redirect("data")
    with transaction.atomic():
        job = data_jobs.start_import(request.user, upload.name or "upload.json", upload.read())
        record(Action.IMPORT, target=job, request=request, detail={"file": job.filename})
    messages.info(request, "Your file is being imported. Its progress and result are listed below.")
    return redirect("data")


def _too_large(request: HttpRequest) -> HttpResponse:
    limit = settings.IMPORT_MAX_BYTES / 1_000_000
    messages.error(request, f"Nothing was imported: the file is larger than {limit:g} MB.")
    return redirect("data")


@require_GET
@login_required
def download_job(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(DataJob, pk=job_id, owner=request.user, kind=DataJob.Kind.EXPORT)
    if job.status != DataJob.Status.DONE or job.payload is None:
        messages.error(request, "That export is not ready.")
        return redirect("data")
    return _download(bytes(job.payload), job.filename, job.content_type)
