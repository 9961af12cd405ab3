"""Login throttling: too many failed logins for one username from one client answer 429.

Failures are counted in Django's cache (Redis when ``REDIS_URL`` is set, so every
process sees the same counts) under a key for (username, client address), in a
fixed window of ``LOGIN_FAILURE_WINDOW`` seconds that starts at the first failure.
Once ``LOGIN_FAILURE_LIMIT`` is reached, that pair gets 429 until the window ends,
even with the right password; other usernames, and the same username from other
clients, are unaffected. A successful login clears the pair's count.

Failures are counted from Django's ``user_login_failed`` signal, so the site's
login page and the admin's are counted alike; ``throttled`` guards both views. A guarded
attempt counts before its password is checked (the count's atomic increment is its
reservation): attempts in flight together cannot all pass a count that none of them has
raised yet. The reservation stays as the attempt's failure, goes with the count on
success, and is handed back when the password was never checked (an incomplete form).
"""

from __future__ import annotations

import hashlib
from functools import wraps

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from conversations.error_pages import too_many
from conversations.ops.window_counts import add_one, take_one_back

USERNAME_FIELD = "username"


def client_address(request: HttpRequest | None) -> str:
    """REMOTE_ADDR. Behind a proxy, the proxy (or ASGI server's --proxy-headers) must set
    it from the forwarded header: trusting X-Forwarded-For here would let a client pick it."""
    if request is None:
        return ""
    return request.META.get("REMOTE_ADDR", "")


def _key(username: str, client: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}\0{client}".encode()).hexdigest()[:32]
    return f"login-failures:{digest}"


def record_failure(username: str, client: str) -> None:
    add_one(_key(username, client), settings.LOGIN_FAILURE_WINDOW)


@receiver(user_login_failed)
def _count_failure(sender, credentials: dict, request: HttpRequest | None = None, **kwargs) -> None:
    if request is not None and getattr(request, "login_attempt_reserved", False):
        request.login_attempt_settled = True  # its reservation is the failure
        return
    username = credentials.get(USERNAME_FIELD)
    if request is not None and username:
        record_failure(str(username), client_address(request))


@receiver(user_logged_in)
def _clear_failures(sender, request: HttpRequest | None, user, **kwargs) -> None:
    if request is not None:
        cache.delete(_key(user.get_username(), client_address(request)))
        request.login_attempt_settled = True  # nothing to hand back: the count is gone


def too_many_attempts() -> HttpResponse:
    minutes = max(1, round(settings.LOGIN_FAILURE_WINDOW / 60))
    message = f"Too many failed sign-in attempts for this account. Try again in about {minutes} minutes."
    return too_many(None, message, retry_after=settings.LOGIN_FAILURE_WINDOW)


def throttled(view):
    """Wrap a login view: a POST for a locked (username, client) pair is a 429 and the
    password is not even checked; any other POST reserves its place in the count first."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        username = request.POST.get(USERNAME_FIELD, "") if request.method == "POST" else ""
        if not username:
            return view(request, *args, **kwargs)
        key = _key(username, client_address(request))
        if add_one(key, settings.LOGIN_FAILURE_WINDOW) > settings.LOGIN_FAILURE_LIMIT:
            take_one_back(key)  # a refused attempt is not a failure
            return too_many_attempts()
        request.login_attempt_reserved = True
        try:
            return view(request, *args, **kwargs)
        finally:
            if not getattr(request, "login_attempt_settled", False):
                take_one_back(key)

    return wrapper
