"""Adding one finished answer or API call to its day's aggregate row.

The row is created if missing (a unique constraint makes a concurrent creation fail, and
the loser retries as an update), then its counters are increased by one UPDATE with ``F``
expressions: two processes adding to one row never lose each other's counts."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from conversations.models.usage import TTFT_BOUNDS_MS, TTFT_FIELDS, UsageDay

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    user_id: int
    model: str
    source: str  # UsageDay.Source
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_ms: float | None


def ttft_field(ttft_ms: float) -> str:
    return TTFT_FIELDS[bisect.bisect_left(TTFT_BOUNDS_MS, ttft_ms)]


def add(done: Finished) -> None:
    """Never raises: usage figures must not fail the answer they count."""
    try:
        _add(done)
    except Exception:
        log.exception("could not add a finished request to the usage figures")


def _add(done: Finished) -> None:
    key = {
        "day": timezone.now().date(),
        "user_id": done.user_id,
        "model": done.model[:200],
        "source": done.source,
    }
    changes = {
        "requests": F("requests") + 1,
        "prompt_tokens": F("prompt_tokens") + done.prompt_tokens,
        "completion_tokens": F("completion_tokens") + done.completion_tokens,
        "cached_tokens": F("cached_tokens") + done.cached_tokens,
    }
    if done.ttft_ms is not None:
        name = ttft_field(done.ttft_ms)
        changes[name] = F(name) + 1
    if UsageDay.objects.filter(**key).update(**changes):
        return
    try:
        with transaction.atomic():
            UsageDay.objects.create(**key)
    except IntegrityError:
        pass  # another process made it first
    UsageDay.objects.filter(**key).update(**changes)
