"""The request being served, for audit entries written far from the view (signal receivers
for model changes, the admin's deletions): its user is the actor and its client the address.

A context variable, set by ``AuditContextMiddleware`` for the length of each request: asgiref
carries it into the threads that run sync views, and each request has its own context.
"""

from __future__ import annotations

from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

_current: ContextVar[HttpRequest | None] = ContextVar("audit_request", default=None)


def current_request() -> HttpRequest | None:
    return _current.get()


class AuditContextMiddleware:
    """After ``AuthenticationMiddleware``: the request (and so its user) is known to the log."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _current.set(request)
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)
