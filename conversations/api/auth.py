"""Bearer API keys: ``Authorization: Bearer sk-…``."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja.security import HttpBearer

from conversations.accounts.access import access_for
from conversations.api import rate_limit
from conversations.api.errors import ApiError
from conversations.api.usage import RequestLog
from conversations.models import ApiKey


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _masked(token: str) -> str:
    return f"{token[:6]}…{token[-4:]}" if len(token) > 12 else "…"


def checked_key(token: str) -> ApiKey:
    """The live key ``token`` names, with this call counted against its rate limit: one hop
    to a worker thread for the lookup and the count (each its own hop, the count two, cost
    the event loop more than the work). Rejected calls cost a cache increment, not a
    database write: the usage row comes after."""
    key = ApiKey.objects.find(token)
    if key is None or not key.owner.is_active:
        raise _unauthorized(f"Incorrect API key provided: {_masked(token)}.")
    if not key.is_active:
        raise _unauthorized(f"The API key {key.prefix}… has been revoked.")
    key.access = access_for(key.owner_id)
    if not key.access.api:
        raise ApiError(
            403,
            "Your groups do not include access to the API. Ask your administrator.",
            type="permission_error",
            code="api_access_denied",
        )
    rate_limit.count(key)
    return key


class ApiKeyAuth(HttpBearer):
    """Resolves the key; the request then carries ``request.auth`` (the ApiKey) and
    ``request.api_log`` (its usage row, written when the call ends)."""

    async def __call__(self, request: HttpRequest) -> ApiKey:  # type: ignore[override]
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if not header or scheme.lower() != "bearer" or not token:
            raise _unauthorized(
                "You didn't provide an API key. Send it in an Authorization header: "
                "'Authorization: Bearer YOUR_KEY'. Create keys on the site's API keys page."
            )
        key = await sync_to_async(checked_key)(token)
        request.api_log = RequestLog(key=key, endpoint=request.path)  # type: ignore[attr-defined]
        return key

    async def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:  # pragma: no cover
        raise NotImplementedError  # __call__ does the work
