"""The API keys settings page: a user creates keys (each shown once) and revokes them."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from conversations.accounts.user_lock import lock_user
from conversations.audit.log import Action, record
from conversations.models import ApiKey

MAX_ACTIVE_KEYS = 20


def _page(
    request: HttpRequest, new_key: str | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    keys = (
        ApiKey.objects.filter(owner=request.user)
        .annotate(
            num_requests=Count("requests"),
            num_tokens=Sum("requests__prompt_tokens") + Sum("requests__completion_tokens"),
            last_request=Max("requests__created_at"),
        )
        .order_by("revoked_at", "-created_at")
    )
    totals = request.user.api_requests.aggregate(
        requests=Count("id"),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
        errors=Count("id", filter=Q(status_code__gte=400)),
    )
    context = {
        "keys": keys,
        "new_key": new_key,
        "error": error,
        "totals": totals,
        "api_base": request.build_absolute_uri("/v1"),
    }
    response = render(request, "conversations/api_keys.html", context, status=status)
    if new_key:
        response["Cache-Control"] = "no-store"
    return response


@never_cache
@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _page(request)
    name = request.POST.get("name", "").strip()[:100]
    raw = None
    with transaction.atomic():  # the user's row locked: keys made at once are counted one by one
        lock_user(request.user.pk)
        if ApiKey.objects.filter(owner=request.user).active().count() < MAX_ACTIVE_KEYS:
            key, raw = ApiKey.objects.create_key(request.user, name=name)
            record(Action.API_KEY_CREATE, target=key, request=request)
    if raw is None:
        return _page(request, error=f"You have {MAX_ACTIVE_KEYS} active keys: revoke one first.", status=400)
    # Rendered, not redirected: the raw key exists only in this response.
    return _page(request, new_key=raw)


@never_cache
@login_required
@require_POST
def revoke_api_key(request: HttpRequest, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=key_id, owner=request.user)
    with transaction.atomic():
        if key.is_active:
            key.revoke()
            record(Action.API_KEY_REVOKE, target=key, request=request)
    messages.success(request, f"Revoked the key {key.prefix}….")
    return redirect("api_keys")
