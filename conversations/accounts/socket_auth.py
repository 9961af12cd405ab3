"""Channels' websocket authentication, reading the user with a prepared query.

Channels' ``AuthMiddleware`` resolves a tab's user on every connect through the session's
backend, and ``ModelBackend.get_user`` builds and compiles its query each time. Here the
same steps run (the session's user id and backend, the backend's own ``user_can_authenticate``,
the session hash checked against the user's current password) with the row read by
``conversations.accounts.user_rows.user_by_id`` when the backend is Django's ``ModelBackend``;
any other backend is asked as Channels asks it.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware, CookieMiddleware, SessionMiddleware
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare

from conversations.accounts.user_rows import user_by_id


class SocketAuthMiddleware(AuthMiddleware):
    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await socket_user(scope)


def socket_auth_stack(inner: Any) -> Any:
    """Channels' ``AuthMiddlewareStack`` with this middleware."""
    return CookieMiddleware(SessionMiddleware(SocketAuthMiddleware(inner)))


@database_sync_to_async
def socket_user(scope: dict[str, Any]) -> Any:
    """The scope's signed-in user, or ``AnonymousUser`` (as ``channels.auth.get_user``)."""
    session = scope["session"]
    try:
        user_id = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
        backend_path = session[BACKEND_SESSION_KEY]
    except KeyError:
        return AnonymousUser()
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return AnonymousUser()
    backend = load_backend(backend_path)
    if type(backend) is ModelBackend:
        rows = user_by_id(user_id)
        user = rows[0] if rows and backend.user_can_authenticate(rows[0]) else None
    else:
        user = backend.get_user(user_id)
    if user is None:
        return AnonymousUser()
    if hasattr(user, "get_session_auth_hash"):
        session_hash = session.get(HASH_SESSION_KEY)
        if not (session_hash and constant_time_compare(session_hash, user.get_session_auth_hash())):
            session.flush()
            return AnonymousUser()
    return user
