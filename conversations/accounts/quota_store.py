"""Token counters that every process of the site shares, changed atomically.

With ``REDIS_URL`` the counters are Redis keys changed by Lua scripts (one script runs alone on
the server: a check and its increment cannot interleave with another process's). Without it
the site is one process (the in-memory channel layer), and a lock in the process does the same.
Each counter key names its subject, kind and period, and expires after its period.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Protocol

from django.conf import settings

# KEYS: the counters; ARGV[1]: how many of them (the first) are prompt counters; ARGV[2]: the
# prompt's tokens; then each counter's limit, then each counter's expiry (s). A prompt counter
# refuses when the prompt would take it past its limit, a completion counter once it is spent.
# Returns the refusing counter's 1-based index, or 0 after adding the prompt to the prompt counters.
ADMIT = """
local np = tonumber(ARGV[1])
local p = tonumber(ARGV[2])
local n = #KEYS
for i = 1, n do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  local limit = tonumber(ARGV[2 + i])
  if (i <= np and used + p > limit) or (i > np and used >= limit) then return i end
end
if p > 0 then
  for i = 1, np do
    redis.call('INCRBY', KEYS[i], p)
    redis.call('EXPIRE', KEYS[i], ARGV[2 + n + i])
  end
end
return 0
"""
# KEYS: counters; ARGV[1]: tokens (negative: a refund); then limits, then expiries.
# Returns 1 while every counter is under its limit after the change.
CHARGE = """
local t = tonumber(ARGV[1])
local n = #KEYS
local ok = 1
for i = 1, n do
  local used = redis.call('INCRBY', KEYS[i], t)
  redis.call('EXPIRE', KEYS[i], ARGV[1 + n + i])
  if used >= tonumber(ARGV[1 + i]) then ok = 0 end
end
return ok
"""


@dataclass(frozen=True)
class Counter:
    key: str
    kind: str  # "prompt" | "completion"
    period: str  # "day" | "month"
    subject: str  # "you", or the group's name
    limit: int
    ttl: int  # seconds the key lives (past the end of its period)
    resets_at: datetime


class CounterStore(Protocol):
    def admit(self, prompt: Sequence[Counter], completion: Sequence[Counter], prompt_tokens: int) -> int: ...
    def charge(self, counters: Sequence[Counter], tokens: int) -> bool: ...
    def used(self, counters: Sequence[Counter]) -> list[int]: ...


class RedisCounters:
    def __init__(self, url: str) -> None:
        import redis  # noqa: PLC0415 - only sites with Redis need it loaded

        self.client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._admit = self.client.register_script(ADMIT)
        self._charge = self.client.register_script(CHARGE)

    def admit(self, prompt: Sequence[Counter], completion: Sequence[Counter], prompt_tokens: int) -> int:
        counters = [*prompt, *completion]
        args = [len(prompt), prompt_tokens, *(c.limit for c in counters), *(c.ttl for c in counters)]
        return int(self._admit(keys=[c.key for c in counters], args=args))

    def charge(self, counters: Sequence[Counter], tokens: int) -> bool:
        args = [tokens, *(c.limit for c in counters), *(c.ttl for c in counters)]
        return bool(self._charge(keys=[c.key for c in counters], args=args))

    def used(self, counters: Sequence[Counter]) -> list[int]:
        if not counters:
            return []
        return [int(v or 0) for v in self.client.mget([c.key for c in counters])]


class MemoryCounters:
    """One process's counters (a site without Redis runs one process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, int] = {}

    def admit(self, prompt: Sequence[Counter], completion: Sequence[Counter], prompt_tokens: int) -> int:
        with self.lock:
            for i, c in enumerate([*prompt, *completion], start=1):
                used = self.values.get(c.key, 0)
                if (i <= len(prompt) and used + prompt_tokens > c.limit) or (
                    i > len(prompt) and used >= c.limit
                ):
                    return i
            for c in prompt:
                self.values[c.key] = self.values.get(c.key, 0) + prompt_tokens
            return 0

    def charge(self, counters: Sequence[Counter], tokens: int) -> bool:
        with self.lock:
            ok = True
            for c in counters:
                self.values[c.key] = self.values.get(c.key, 0) + tokens
                ok = ok and self.values[c.key] < c.limit
            return ok

    def used(self, counters: Sequence[Counter]) -> list[int]:
        with self.lock:
            return [self.values.get(c.key, 0) for c in counters]


@cache
def _store_for(url: str) -> CounterStore:
    return RedisCounters(url) if url else MemoryCounters()


def counter_store() -> CounterStore:
    return _store_for(settings.REDIS_URL or "")
