"""Emptying the token-quota counters between tests, whichever store the run uses."""

from __future__ import annotations

from conversations.accounts.quota_store import MemoryCounters, RedisCounters, counter_store


def forget_counters() -> None:
    store = counter_store()
    if isinstance(store, MemoryCounters):
        with store.lock:
            store.values.clear()
    elif isinstance(store, RedisCounters):
        for key in store.client.scan_iter("quota:*"):
            store.client.delete(key)
