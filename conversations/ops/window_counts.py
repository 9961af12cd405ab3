"""Counts in fixed windows, in Django's cache (Redis when ``REDIS_URL`` is set, so every
process adds to the same count; local memory otherwise). The rate limits use them.

The cache's own ``incr`` is the atomic step (LocMem's lock, Redis's INCR). Its async twin in
Django reads the count and writes it back in two awaits, so calls together would all read
the same count: these are blocking calls, for a worker thread or a sync view."""

from __future__ import annotations

from django.core.cache import cache


def add_one(key: str, window_s: float) -> int:
    """The count under ``key`` once this one is added; the first starts a window of
    ``window_s`` seconds, which later ones do not extend."""
    cache.add(key, 0, timeout=window_s)
    try:
        return cache.incr(key)
    except ValueError:  # the window ended between add and incr: a new one starts
        cache.set(key, 1, timeout=window_s)
        return 1


def take_one_back(key: str) -> None:
    """Undo an ``add_one`` (nothing, if its window has ended)."""
    try:
        cache.decr(key)
    except ValueError:
        pass
