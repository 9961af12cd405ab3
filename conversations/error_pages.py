"""The site's error pages: each in the site's look with a way back, instead of Django's bare
ones. ``chatsite.urls`` points Django's 404, 403 and 500 handlers here; views that answer 410
or 429 themselves render :func:`gone` and :func:`too_many` pages.

The API keeps its own JSON errors (``conversations.api.errors``): these are for pages.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template import loader


def _page(template: str, status: int, request: HttpRequest | None = None, **context: object) -> HttpResponse:
    body = loader.render_to_string(template, context, request=request)
    return HttpResponse(body, status=status, content_type="text/html; charset=utf-8")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page("404.html", 404, request)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page("403.html", 403, request)


def server_error(request: HttpRequest) -> HttpResponse:
    # No request context: whatever broke may be in a context processor or the session.
    return _page("500.html", 500)


def gone(request: HttpRequest | None, heading: str, message: str) -> HttpResponse:
    return _page("410.html", 410, request, heading=heading, message=message)


def too_many(request: HttpRequest | None, message: str, retry_after: int | None = None) -> HttpResponse:
    response = _page("429.html", 429, request, message=message)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
