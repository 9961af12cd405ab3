"""The usage pages' figures, from the daily aggregates (``UsageDay``) of the last days."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, timedelta

from django.db.models import F, Sum
from django.utils import timezone

from conversations.models.usage import TTFT_BOUNDS_MS, TTFT_FIELDS, UsageDay
from conversations.usage.charts import Chart, lines, stacked_bars

DAYS = 30
TOP_NAMES = 8  # series per chart; the rest add up as "others"


def window(days: int = DAYS) -> list[date]:
    today = timezone.now().date()
    return [today - timedelta(days=days - 1 - i) for i in range(days)]


def _series(rows, name_of, days: list[date], value: str) -> dict[str, list[float]]:
    index = {day: i for i, day in enumerate(days)}
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    for row in rows:
        by_name[name_of(row) or "(none)"][index[row["day"]]] += row[value] or 0
    ranked = sorted(by_name, key=lambda n: -sum(by_name[n]))
    series = {name: by_name[name] for name in ranked[:TOP_NAMES]}
    rest = ranked[TOP_NAMES:]
    if rest:
        series["others"] = [sum(by_name[n][i] for n in rest) for i in range(len(days))]
    return series


def user_charts(user_id: int) -> list[Chart]:
    days = window()
    index = {day: i for i, day in enumerate(days)}
    prompt, completion, requests = ([0.0] * len(days) for _ in range(3))
    rows = (
        UsageDay.objects.filter(user_id=user_id, day__gte=days[0])
        .values("day")
        .annotate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"), n=Sum("requests"))
    )
    for row in rows:
        i = index[row["day"]]
        prompt[i], completion[i], requests[i] = row["p"], row["c"], row["n"]
    return [
        stacked_bars(
            "Your tokens per day, last 30 days",
            days,
            {"prompt tokens": prompt, "completion tokens": completion},
            "tokens",
        ),
        stacked_bars("Your requests per day, last 30 days", days, {"requests": requests}, "requests"),
    ]


def admin_charts() -> list[Chart]:
    days = window()
    recent = UsageDay.objects.filter(day__gte=days[0])
    tokens = F("prompt_tokens") + F("completion_tokens")
    by_user = list(recent.values("day", name=F("user__username")).annotate(t=Sum(tokens)))
    by_model = list(recent.values("day", name=F("model")).annotate(t=Sum(tokens)))
    # A user in several groups counts in each; one in none, under "(none)".
    by_group = list(recent.values("day", name=F("user__groups__name")).annotate(t=Sum(tokens)))
    requests = list(recent.values("day", name=F("source")).annotate(t=Sum("requests")))
    ttft = list(recent.values("day").annotate(**{f: Sum(f) for f in TTFT_FIELDS}))
    name = lambda r: r["name"]  # noqa: E731 - the one key every grouping names
    p50, p95 = percentiles(ttft, days)
    return [
        stacked_bars("Tokens per day by user", days, _series(by_user, name, days, "t"), "tokens"),
        stacked_bars("Tokens per day by group", days, _series(by_group, name, days, "t"), "tokens"),
        stacked_bars("Tokens per day by model", days, _series(by_model, name, days, "t"), "tokens"),
        stacked_bars("Requests per day (chat and API)", days, _series(requests, name, days, "t"), "requests"),
        lines("Time to first token (ms), p50 and p95", days, {"p50": p50, "p95": p95}, "ms"),
    ]


def percentile_of(buckets: list[int], q: float) -> float | None:
    """The bucket bound under which ``q`` of the counts fall (the last bound for the open bucket)."""
    total = sum(buckets)
    if not total:
        return None
    seen = 0
    for i, count in enumerate(buckets):
        seen += count
        if seen >= q * total:
            return float(TTFT_BOUNDS_MS[min(i, len(TTFT_BOUNDS_MS) - 1)])
    return float(TTFT_BOUNDS_MS[-1])


def percentiles(rows: list[dict], days: list[date]) -> tuple[list[float | None], list[float | None]]:
    by_day = {row["day"]: [row[f] or 0 for f in TTFT_FIELDS] for row in rows}
    p50 = [percentile_of(by_day.get(day, []), 0.5) for day in days]
    p95 = [percentile_of(by_day.get(day, []), 0.95) for day in days]
    return p50, p95
