"""The documents' JSON endpoints (the chat page's attachments) and pages (Your files, a
passage opened from a citation).

A document is its uploader's alone: every lookup filters by ``owner=request.user``, and
another user's id is a 404.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from conversations.accounts.access import access_for
from conversations.chat.json_guard import json_body, login_required_json
from conversations.chat.views import _own_conversation
from conversations.documents.formats import ACCEPT, DocumentError
from conversations.documents.jobs import UploadRateLimited, count_upload, fail_stale, start_upload
from conversations.models import ConversationDocument, Document, Message, MessageSources

LIST_LIMIT = 500


def document_dict(d: Document) -> dict:
    return {
        "id": d.pk, "filename": d.filename, "kind": d.kind, "size": d.size, "status": d.status,
        "progress": d.progress, "error": d.error, "pages": d.pages, "num_tokens": d.num_tokens,
        "created_at": d.created_at.isoformat(),
    }  # fmt: skip


def _fields():
    return Document.objects.defer("payload", "text")


def _upload(request: HttpRequest) -> Document:
    """The request's file stored as a new document; ``DocumentError`` for a bad one."""
    announced = int(request.META.get("CONTENT_LENGTH") or 0)
    if announced > settings.DOCUMENT_MAX_BYTES + 65_536:
        raise DocumentError(
            f"The upload is {announced:,} bytes; a file may have at most {settings.DOCUMENT_MAX_BYTES:,}."
        )
    upload = request.FILES.get("file")
    if upload is None:
        raise DocumentError("No file was sent (the form field is `file`).")
    if upload.size > settings.DOCUMENT_MAX_BYTES:
        raise DocumentError(
            f"{upload.name} is {upload.size:,} bytes; a file may have at most {settings.DOCUMENT_MAX_BYTES:,}."
        )
    count_upload(request.user)
    return start_upload(request.user, upload.name or "file", upload.read())


@never_cache
@login_required_json
@require_POST
def upload(request: HttpRequest) -> JsonResponse:
    """Multipart ``file`` (and optional ``conversation_id``: attach it there too)."""
    conversation = None
    target = request.POST.get("conversation_id", "")
    if target:
        if not target.isdigit():
            return JsonResponse(
                {"detail": "conversation_id must be a number.", "code": "invalid"}, status=400
            )
        conversation = _own_conversation(request, int(target))
    try:
        document = _upload(request)
    except UploadRateLimited as exc:
        response = JsonResponse({"detail": str(exc), "code": "rate_limited"}, status=429)
        response["Retry-After"] = str(exc.retry_after)
        return response
    except DocumentError as exc:
        return JsonResponse({"detail": str(exc), "code": "invalid_file"}, status=400)
    if conversation is not None:
        ConversationDocument.objects.get_or_create(conversation=conversation, document=document)
    return JsonResponse({"document": document_dict(document)}, status=201)


@never_cache
@login_required_json
@require_GET
def library(request: HttpRequest) -> JsonResponse:
    fail_stale(request.user)
    docs = _fields().filter(owner=request.user)[:LIST_LIMIT]
    return JsonResponse({"documents": [document_dict(d) for d in docs], "accept": ACCEPT})


@never_cache
@login_required_json
@require_GET
def detail(request: HttpRequest, pk: int) -> JsonResponse:
    return JsonResponse({"document": document_dict(get_object_or_404(_fields(), pk=pk, owner=request.user))})


@login_required_json
@require_POST
def delete(request: HttpRequest, pk: int) -> HttpResponse:
    document = get_object_or_404(Document, pk=pk, owner=request.user)
    name = document.filename
    document.delete()
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"deleted": pk})
    messages.success(request, f"Deleted {name}.")
    return redirect("documents-page")


def _sources(conversation_id: int) -> dict[str, dict]:
    """Citations by answer id: an answer cites what its question's sources hold."""
    rows = MessageSources.objects.filter(message__conversation_id=conversation_id).values(
        "message_id", "passages", "whole"
    )
    by_question = {r["message_id"]: {"passages": r["passages"], "whole": r["whole"]} for r in rows}
    answers = Message.objects.filter(
        conversation_id=conversation_id, parent_id__in=list(by_question)
    ).values_list("id", "parent_id")
    return {str(answer): by_question[question] for answer, question in answers}


@never_cache
@login_required_json
def conversation_documents(request: HttpRequest, pk: int) -> JsonResponse:
    """GET: the documents the conversation draws on and its answers' citations.
    POST ``{"document_id"}``: draw on that document of the user's library too."""
    conversation = _own_conversation(request, pk)
    if request.method == "POST":
        doc_id = json_body(request).get("document_id")
        document = get_object_or_404(
            Document, pk=int(doc_id) if str(doc_id).isdigit() else 0, owner=request.user
        )
        ConversationDocument.objects.get_or_create(conversation=conversation, document=document)
    fail_stale(request.user)
    attached = _fields().filter(attachments__conversation=conversation, owner=request.user).order_by("pk")
    return JsonResponse(
        {"documents": [document_dict(d) for d in attached], "sources": _sources(conversation.pk)}
    )


@login_required_json
@require_POST
def detach(request: HttpRequest, pk: int, document_id: int) -> JsonResponse:
    conversation = _own_conversation(request, pk)
    ConversationDocument.objects.filter(
        conversation=conversation, document_id=document_id, document__owner=request.user
    ).delete()
    return JsonResponse({"detached": document_id})


@never_cache
@login_required
@require_GET
def passage(request: HttpRequest, pk: int) -> HttpResponse:
    """The document's text with the passage ``?start=&end=`` (characters) marked."""
    document = get_object_or_404(Document, pk=pk, owner=request.user, status=Document.Status.READY)
    text = document.text
    try:
        start = max(0, min(len(text), int(request.GET.get("start", 0))))
        end = max(start, min(len(text), int(request.GET.get("end", start))))
    except ValueError:
        start = end = 0
    context = {"document": document, "before": text[:start], "passage": text[start:end], "after": text[end:]}
    return render(request, "conversations/document_passage.html", context)


@never_cache
@login_required
def documents_page(request: HttpRequest) -> HttpResponse:
    """Your files: list, upload (no script), delete."""
    if request.method == "POST":
        try:
            document = _upload(request)
            messages.success(request, f"Uploaded {document.filename}; its text is being read.")
        except DocumentError as exc:
            messages.error(request, str(exc))
        return redirect("documents-page")
    fail_stale(request.user)
    docs = list(_fields().filter(owner=request.user)[:LIST_LIMIT])
    used = Document.objects.filter(owner=request.user).aggregate(total=Sum("size"))["total"] or 0
    context = {
        "documents": docs,
        "busy": any(d.status in ("pending", "extracting") for d in docs),
        "used_mb": used / 1e6,
        "max_mb": access_for(request.user.pk).document_max_bytes / 1e6,
        "file_max_mb": settings.DOCUMENT_MAX_BYTES / 1e6,
        "accept": ",".join(ACCEPT),
    }
    return render(request, "conversations/documents.html", context)
