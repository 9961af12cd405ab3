"""The Content-Security-Policy header on every HTML response (Django 5.2 has none built in)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware


@sync_and_async_middleware
def ContentSecurityPolicyMiddleware(get_response: Callable) -> Callable:  # noqa: N802 - middleware name
    from asgiref.sync import iscoroutinefunction

    def add_header(response: HttpResponse) -> HttpResponse:
        content_type = response.get("Content-Type", "")
        if content_type.startswith("text/html") and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = settings.CONTENT_SECURITY_POLICY
        return response

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            return add_header(await get_response(request))

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            return add_header(get_response(request))

    return middleware
