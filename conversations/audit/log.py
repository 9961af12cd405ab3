"""Writing audit entries: one call, in the caller's transaction.

Callers wrap the change and the ``record`` call in one ``transaction.atomic`` block (signal
receivers run inside the transaction of the save that sent them), so the entry commits or
rolls back with its change.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.http import HttpRequest

from conversations.accounts.login_throttle import client_address
from conversations.audit.context import current_request
from conversations.models.audit import AuditEvent

Action = AuditEvent.Action


def _actor_of(request: HttpRequest | None) -> Any:
    user = getattr(request, "user", None) if request is not None else None
    return user if user is not None and user.is_authenticated else None


def record(
    action: str,
    *,
    target: models.Model | None = None,
    actor: Any = None,
    request: HttpRequest | None = None,
    detail: dict | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
) -> AuditEvent:
    """Write one entry. The actor is ``actor``, else the signed-in user of ``request`` (or of
    the request being served); the address is that request's client."""
    request = request if request is not None else current_request()
    actor = actor if actor is not None else _actor_of(request)
    if target is not None:
        object_type = object_type or target._meta.label_lower
        object_id = object_id or str(target.pk)
        object_repr = object_repr or str(target)[:200]
    address = client_address(request) or None
    return AuditEvent.objects.create(
        action=action,
        actor_id=actor.pk if actor is not None else None,
        actor_name=actor.get_username() if actor is not None else "",
        address=address,
        object_type=object_type,
        object_id=object_id,
        object_repr=object_repr[:200],
        detail=detail or {},
    )
