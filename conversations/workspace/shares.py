"""Share-link views: create one (JSON, from the chat page), the list of mine with revoke, the
read-only shared page, and "Continue in my account".

The shared page shows the conversation's title and the copied messages, escaped by the
template (answers are then drawn as Markdown in the browser through DOMPurify), and nothing
else of its owner: no name, no other conversation, no sidebar. It is ``noindex``.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from conversations.accounts.access import access_for
from conversations.audit.log import Action, record
from conversations.chat.tree import Busy
from conversations.error_pages import gone, too_many
from conversations.models import Conversation, Share
from conversations.workspace.http import login_required_json
from conversations.workspace.sharing import (
    ShareLimit,
    check_continue_caps,
    check_share_caps,
    fork_share,
    may_read,
    shown_messages,
    take_snapshot,
)


def _limited(exc: ShareLimit) -> JsonResponse:
    response = JsonResponse({"detail": str(exc)}, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


def share_dict(request: HttpRequest, share: Share) -> dict:
    return {
        "id": share.pk,
        "title": share.title,
        "url": request.build_absolute_uri(reverse("share-page", args=[share.token])),
        "created_at": share.created_at.isoformat(),
        "active": share.is_active,
    }


@require_POST
@login_required_json
def share_create(request: HttpRequest, pk: int) -> JsonResponse:
    conversation = get_object_or_404(Conversation, pk=pk, owner=request.user)
    if conversation.temporary:
        return JsonResponse({"detail": "a temporary chat cannot be shared"}, status=400)
    if not access_for(request.user.pk).sharing:
        return JsonResponse({"detail": "your groups do not allow sharing conversations"}, status=403)
    try:
        check_share_caps(request.user)
        with transaction.atomic():
            share = take_snapshot(conversation)
            record(
                Action.SHARE_CREATE, target=share, request=request, detail={"conversation": conversation.pk}
            )
    except Busy as exc:
        return JsonResponse({"detail": str(exc)}, status=409)
    except ShareLimit as exc:
        return _limited(exc)
    return JsonResponse({"share": share_dict(request, share)}, status=201)


@require_GET
@login_required
@never_cache
def my_shares(request: HttpRequest) -> HttpResponse:
    shares = Share.objects.filter(owner=request.user).defer("messages", "settings")
    rows = [share_dict(request, s) | {"revoked_at": s.revoked_at} for s in shares]
    context = {"shares": rows, "public_shares": settings.ALLOW_PUBLIC_SHARES}
    return render(request, "conversations/shares.html", context)


@require_POST
@login_required
def share_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    # A revoked link is never read again: its copy goes with it.
    with transaction.atomic():
        live = (
            Share.objects.select_for_update()
            .filter(pk=pk, owner=request.user, revoked_at__isnull=True)
            .first()
        )
        if live is not None:
            live.revoked_at = timezone.now()
            live.messages, live.settings = [], {}
            live.save(update_fields=["revoked_at", "messages", "settings"])
            record(Action.SHARE_REVOKE, target=live, request=request)
    if not Share.objects.filter(pk=pk, owner=request.user).exists():
        raise Http404("no such share")
    return redirect("my-shares")


def _readable(request: HttpRequest, token: str) -> Share | HttpResponse:
    # A deactivated owner's links stop working with their account.
    share = Share.objects.filter(token=token, owner__is_active=True).first()
    if share is None:
        raise Http404("this link does not exist")
    if not share.is_active:
        return gone(
            request,
            "This share link was revoked",
            "Its owner revoked this link: what it showed is no longer shared.",
        )
    if not may_read(share, request.user):
        return redirect_to_login(request.get_full_path())
    return share


def _private(response: HttpResponse) -> HttpResponse:
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Cache-Control"] = "private, no-store"
    return response


@require_GET
@never_cache
def share_page(request: HttpRequest, token: str) -> HttpResponse:
    share = _readable(request, token)
    if isinstance(share, HttpResponse):
        return share
    messages = [
        {
            "role": m["role"],
            "content": m["content"],
            "reasoning": m.get("reasoning") or "",
            "model": m.get("model_name") or "",
        }
        for m in shown_messages(share.messages)
    ]
    context = {"share": share, "messages": messages, "system_prompt": share.settings.get("system_prompt", "")}
    return _private(render(request, "conversations/shared.html", context))


@require_POST
def share_continue(request: HttpRequest, token: str) -> HttpResponse:
    """Fork the share into the signed-in user's account and open it."""
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("share-page", args=[token]))
    share = _readable(request, token)
    if isinstance(share, HttpResponse):
        return share
    try:
        check_continue_caps(request.user)
    except ShareLimit as exc:
        if exc.status == 429:
            return _private(too_many(request, str(exc), exc.retry_after))
        return _private(HttpResponse(str(exc), status=exc.status, content_type="text/plain; charset=utf-8"))
    conversation = fork_share(share, request.user)
    return redirect("conversation", pk=conversation.pk)
