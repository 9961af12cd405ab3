"""Token quotas: a user's own and their groups' (``TokenQuota``), per UTC day and calendar
month, for prompt and completion tokens.

- Admission (``admit``), for the chat and ``/v1``: one atomic step of the shared counters
  (``quota_store``) refuses when a completion budget is spent or the prompt would overrun a
  prompt budget, and otherwise counts the prompt. The refusal (``Exhausted``) says what ran
  out and when it resets.
- Generation: the engine charges each step's output tokens to the request's ``QuotaGate``
  and stops it, with ``finish_reason="length"``, in the step that spends a budget.
- Cached prompt tokens: once the engine reports them, ``settle_cached`` gives back the
  discount share (``cached_prompt_discount``) of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from conversations.accounts.quota_store import Counter, counter_store
from conversations.models import TokenQuota

log = logging.getLogger(__name__)
# A counter key outlives its period by this much (a late charge still finds it).
KEY_GRACE_SECONDS = 3600
LIMIT_FIELDS = {
    ("prompt", "day"): "prompt_tokens_per_day",
    ("prompt", "month"): "prompt_tokens_per_month",
    ("completion", "day"): "completion_tokens_per_day",
    ("completion", "month"): "completion_tokens_per_month",
}


def period_bounds(period: str, now: datetime) -> tuple[str, datetime]:
    """The period's stamp (part of the key) and when the next one starts (UTC)."""
    now = now.astimezone(UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y%m%d"), start + timedelta(days=1)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y%m"), following


@dataclass(frozen=True)
class QuotaPlan:
    prompt: tuple[Counter, ...]
    completion: tuple[Counter, ...]
    cached_discount: float

    @property
    def empty(self) -> bool:
        return not (self.prompt or self.completion)


def plan_for(user_id: int, now: datetime | None = None) -> QuotaPlan:
    """The counters that bound ``user_id``: their own quota's and each of their groups'."""
    now = now or timezone.now()
    rows = TokenQuota.objects.filter(Q(user_id=user_id) | Q(group__user__id=user_id)).select_related("group")
    prompt: list[Counter] = []
    completion: list[Counter] = []
    discount = 0.0
    for row in rows.order_by("pk"):
        subject_key = f"user:{row.user_id}" if row.user_id else f"group:{row.group_id}"
        subject = "you" if row.user_id else (row.group.name if row.group else "a group")
        discount = max(discount, row.cached_prompt_discount)
        for (kind, period), field in LIMIT_FIELDS.items():
            limit = getattr(row, field)
            if limit is None:
                continue
            stamp, resets_at = period_bounds(period, now)
            ttl = int((resets_at - now).total_seconds()) + KEY_GRACE_SECONDS
            counter = Counter(
                key=f"quota:{subject_key}:{kind}:{period}:{stamp}",
                kind=kind,
                period=period,
                subject=subject,
                limit=int(limit),
                ttl=ttl,
                resets_at=resets_at,
            )
            (prompt if kind == "prompt" else completion).append(counter)
    return QuotaPlan(tuple(prompt), tuple(completion), discount)


class Exhausted(Exception):
    """A budget is spent: what ran out, and when it resets."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        super().__init__(describe(counter))

    @property
    def retry_after(self) -> int:
        return max(1, int((self.counter.resets_at - timezone.now()).total_seconds()) + 1)


def describe(counter: Counter) -> str:
    whose = "Your" if counter.subject == "you" else f"The group {counter.subject}'s"
    period = "daily" if counter.period == "day" else "monthly"
    when = counter.resets_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"{whose} {period} {counter.kind}-token quota ({counter.limit:,} tokens) has run out; it resets at {when}."


class QuotaGate:
    """A request's completion budgets, charged by the engine every step (its ``TokenGate``).
    Charges go to the shared counters; if they cannot be reached the request runs on
    (logged): an outage of the counters must not stop every answer."""

    def __init__(self, plan: QuotaPlan) -> None:
        self.plan = plan
        self.exhausted: Counter | None = None

    def charge(self, tokens: int) -> bool:
        counters = self.plan.completion
        if not counters:
            return True
        try:
            ok = counter_store().charge(counters, tokens)
        except Exception:
            log.warning("token quota: the counters could not be charged", exc_info=True)
            return True
        if not ok and self.exhausted is None:
            used = counter_store().used(counters)
            self.exhausted = next(
                (c for c, u in zip(counters, used, strict=True) if u >= c.limit), counters[0]
            )
        return ok


def admit(user_id: int, prompt_tokens: int) -> QuotaGate | None:
    """Admit a request of ``prompt_tokens`` (0: only check that nothing is spent): its gate,
    None when no quota bounds the user. Raises ``Exhausted``."""
    plan = plan_for(user_id)
    if plan.empty:
        return None
    refused = counter_store().admit(plan.prompt, plan.completion, prompt_tokens)
    if refused:
        raise Exhausted([*plan.prompt, *plan.completion][refused - 1])
    return QuotaGate(plan)


def settle_cached(gate: QuotaGate | None, cached_tokens: int) -> None:
    """Give back the discounted share of the prompt's cached tokens."""
    if gate is None or not gate.plan.prompt or cached_tokens <= 0 or gate.plan.cached_discount <= 0:
        return
    refund = int(cached_tokens * gate.plan.cached_discount)
    if refund:
        try:
            counter_store().charge(gate.plan.prompt, -refund)
        except Exception:
            log.warning("token quota: the cached-token discount could not be given back", exc_info=True)


def usage_of(user_id: int) -> list[tuple[Counter, int]]:
    """Each counter bounding the user, with what it has used (for the settings page)."""
    plan = plan_for(user_id)
    counters = [*plan.prompt, *plan.completion]
    return list(zip(counters, counter_store().used(counters), strict=True)) if counters else []


@dataclass(frozen=True)
class Admission:
    """What the engine gets with an admitted request: its budget gate and fair-share weight."""

    user_id: int
    gate: QuotaGate | None
    weight: float

    def engine_options(self) -> dict[str, object]:
        return {"token_gate": self.gate, "weight": self.weight}


def admission(user_id: int, prompt_tokens: int) -> Admission:
    """``admit`` and the user's scheduler weight (their groups'). Raises ``Exhausted`` after
    writing its audit entry."""
    from conversations.accounts.access import access_for  # noqa: PLC0415 - access imports the models too

    try:
        gate = admit(user_id, prompt_tokens)
    except Exhausted as exc:
        note_exhausted(user_id, exc.counter, "refused")
        raise
    return Admission(user_id, gate, access_for(user_id).scheduler_weight)


def note_exhausted(user_id: int, counter: Counter, how: str) -> None:
    """The audit entry of a spent budget (``how``: "refused" at admission, "stopped" mid-answer)."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415
    from django.db import transaction  # noqa: PLC0415

    from conversations.audit.log import Action, record  # noqa: PLC0415 - the audit log imports the site's models

    user = get_user_model().objects.filter(pk=user_id).first()
    with transaction.atomic():
        record(
            Action.QUOTA_EXHAUSTED,
            actor=user,
            target=user,
            detail={"quota": counter.key.rsplit(":", 1)[0], "limit": counter.limit, "how": how},
        )


def settle(admitted: Admission, cached_tokens: int) -> None:
    """After a request: the cached-prompt discount given back; a budget it spent, audited."""
    settle_cached(admitted.gate, cached_tokens)
    if admitted.gate is not None and admitted.gate.exhausted is not None:
        note_exhausted(admitted.user_id, admitted.gate.exhausted, "stopped")
