"""The ASGI handler for the JSON API under /v1 (not its HTML docs page).

Django's own handler costs every request a new thread (a fresh ``ThreadSensitiveContext``,
joined by yet another thread at the end) and, with WhiteNoise's sync-only middleware in the
stack, runs the middleware chain across a dozen thread hops. Over a thousand streaming API
calls that per-request work outweighs the streaming itself. An API call needs neither the
session, CSRF, auth nor message middleware (it authenticates with a bearer key), so this
handler runs only the header and host middleware, with their hooks called on the event
loop (they do no I/O), and sends the request's short thread-sensitive calls (database
queries, signal receivers) to a few long-lived worker threads, whose database connections
last (``conversations.ops.db_thread``). No middleware blocks a worker while awaiting, so
requests can share them.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.utils.module_loading import import_string

from conversations.ops.asgi_handler import SiteASGIHandler
from conversations.ops.db_thread import keep_connections

# The site's middleware an API response keeps (the rest only matter to browser sessions),
# outermost first, as in settings.MIDDLEWARE.
API_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
SYNC_THREADS = 4
PREFIX = "/v1/"
HTML_PAGES = ("/v1/docs",)  # a browser page: the full site stack (session, CSP)

Handler = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


def is_api_call(scope: dict[str, Any]) -> bool:
    path = scope.get("path", "")
    return path.startswith(PREFIX) and not path.startswith(HTML_PAGES)


def on_loop(middleware_path: str, get_response: Handler) -> Handler:
    """A ``MiddlewareMixin`` middleware whose hooks run inline: Django's async adapter would
    send each hook to a thread."""
    instance = import_string(middleware_path)(get_response)
    process_request = getattr(instance, "process_request", None)
    process_response = getattr(instance, "process_response", None)

    async def middleware(request: HttpRequest) -> HttpResponseBase:
        response = process_request(request) if process_request else None
        response = response or await get_response(request)
        return process_response(request, response) if process_response else response

    return middleware


class ApiHandler(SiteASGIHandler):
    def __init__(self) -> None:
        self._executors = itertools.cycle(
            [
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-sync", initializer=keep_connections)
                for _ in range(SYNC_THREADS)
            ]
        )
        super().__init__()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(API_MIDDLEWARE):
            handler = convert_exception_to_response(on_loop(path, handler))
        self._middleware_chain = handler

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async with ThreadSensitiveContext(executor=next(self._executors)):
            await self.handle(scope, receive, send)
