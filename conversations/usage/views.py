"""The usage pages: a user's own (``/settings/usage/``: their tokens and requests per day,
and their quotas) and the admin's (``/admin/usage/``, staff: tokens per day by user, group
and model, requests, and time to first token)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from conversations.accounts.quota import describe, usage_of
from conversations.usage.figures import admin_charts, user_charts


@never_cache
@login_required
def my_usage(request: HttpRequest) -> HttpResponse:
    quotas = [
        {
            "what": f"{'Your' if c.subject == 'you' else c.subject} {c.kind} tokens per {c.period}",
            "used": used,
            "limit": c.limit,
            "resets_at": c.resets_at,
            "spent": used >= c.limit,
            "notice": describe(c) if used >= c.limit else "",
        }
        for c, used in usage_of(request.user.pk)
    ]
    context = {"charts": user_charts(request.user.pk), "quotas": quotas, "title": "Your usage"}
    return render(request, "conversations/usage.html", context)


@never_cache
@staff_member_required
def site_usage(request: HttpRequest) -> HttpResponse:
    context = {"charts": admin_charts(), "quotas": [], "title": "Usage of the site", "admin": True}
    return render(request, "conversations/usage.html", context)
