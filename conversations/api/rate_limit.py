"""Requests per API key per minute, counted across processes.

A fixed one-minute window per key in Django's cache: Redis when ``REDIS_URL`` is set
(every process shares the count), the local-memory cache otherwise (one process).
The limit is the key's own ``rate_limit_per_minute`` if an admin set one, else
``API_RATE_LIMIT_PER_MINUTE``; 0 turns limiting off for that key.
"""

from __future__ import annotations

import time

from django.conf import settings

from conversations.api.errors import ApiError
from conversations.models import ApiKey
from conversations.ops.window_counts import add_one

WINDOW_S = 60


def limit_for(key: ApiKey) -> int:
    if key.rate_limit_per_minute is not None:
        return key.rate_limit_per_minute
    return settings.API_RATE_LIMIT_PER_MINUTE


def rate_limited(limit: int, retry_after: int) -> ApiError:
    return ApiError(
        429,
        f"Rate limit reached for this API key: {limit} requests per minute. "
        f"Please try again in {retry_after} s.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def count(key: ApiKey, now: float | None = None) -> None:
    """Count one request for ``key``; raise a 429 ``ApiError`` past its limit. Blocking (the
    cache may be Redis): called in a worker thread, with the key's lookup."""
    limit = limit_for(key)
    if limit <= 0:
        return
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    # The hash, not the row id: ids restart with a fresh database, the count's key must not.
    if add_one(f"api-rate:{key.hashed_key[:32]}:{window}", WINDOW_S + 5) > limit:
        retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
        raise rate_limited(limit, retry_after)
