"""``/metrics``: the engine's figures in Prometheus text format, and their JSON for the
admin's live engine page.

The engine keeps plain counters (``inference.engine.metrics``); each scrape turns the
latest ``EngineStats`` snapshot into metric families through a custom collector, so
nothing is double-counted and a process whose engine is not loaded exports only
``chatsite_engine_loaded 0``. Open to staff sessions, and to
``Authorization: Bearer $METRICS_TOKEN`` when that variable is set.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from conversations.ops.engine_handle import engine_status

PREFIX = "chatsite_engine"


def _histogram(name: str, doc: str, data: dict) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, unit="seconds")
    cumulative, buckets = 0, []
    for bound, count in zip([*data.get("buckets", []), float("inf")], data.get("counts", []), strict=False):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    family.add_metric([], buckets, data.get("sum", 0.0))
    return family


class EngineCollector:
    """Reads the engine's snapshot at scrape time."""

    def collect(self) -> Iterator[Metric]:
        status = engine_status()
        stats = status.get("stats")
        yield GaugeMetricFamily(
            f"{PREFIX}_loaded", "1 when this process's engine is loaded", value=int(bool(stats))
        )
        if not stats:
            return
        requests = CounterMetricFamily(
            f"{PREFIX}_requests", "Finished requests by outcome", labels=["outcome"]
        )
        for outcome, count in stats["requests_by_outcome"].items():
            requests.add_metric([outcome], count)
        yield requests
        yield _histogram(f"{PREFIX}_time_to_first_token", "Time to first token", stats["ttft"])
        yield _histogram(
            f"{PREFIX}_time_per_output_token", "Time per output token after the first", stats["tpot"]
        )
        tokens = CounterMetricFamily(f"{PREFIX}_tokens", "Tokens by kind", labels=["kind"])
        tokens.add_metric(["prompt"], stats["total_prompt_tokens"])
        tokens.add_metric(["cached"], stats["cached_tokens"])
        tokens.add_metric(["generated"], stats["total_generated_tokens"])
        yield tokens
        queue = GaugeMetricFamily(
            f"{PREFIX}_requests_in_state", "Requests now in each state", labels=["state"]
        )
        for state in ("running", "waiting", "loading"):
            queue.add_metric([state], stats[state])
        yield queue
        yield CounterMetricFamily(
            f"{PREFIX}_preemptions", "Preempted requests", value=stats["num_preemptions"]
        )
        yield CounterMetricFamily(f"{PREFIX}_swaps", "Preemptions by swap", value=stats["num_swaps"])
        yield CounterMetricFamily(
            f"{PREFIX}_aborts", "Aborted requests", value=stats["requests_by_outcome"].get("abort", 0)
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_tokens_per_second", "Recent output tokens/s", value=stats["tokens_per_s"]
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_kv_retained_keys",
            "KV retention marks in force (conversations open in a tab, here or elsewhere)",
            value=stats["kv_retained_keys"],
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_kv_retained_blocks",
            "Distinct KV blocks retention marks",
            value=stats["kv_retained_blocks"],
        )
        yield from _tier_families(stats["kv_tiers"])
        yield from _pd_families(stats.get("disaggregation") or {})


def _pd_families(pd: dict) -> Iterator[Metric]:
    """Prefill workers (none exported when the engine runs without them)."""
    if not pd:
        return
    workers = GaugeMetricFamily(f"{PREFIX}_pd_workers", "Prefill worker processes", labels=["state"])
    workers.add_metric(["configured"], pd["workers"])
    workers.add_metric(["ready"], pd["workers_ready"])
    yield workers
    yield GaugeMetricFamily(
        f"{PREFIX}_pd_queue_depth", "Prompts held by prefill workers", value=pd["queue_depth"]
    )
    yield CounterMetricFamily(
        f"{PREFIX}_pd_transfer_bytes", "KV bytes moved from prefill workers", value=pd["transfer_bytes"]
    )
    yield CounterMetricFamily(
        f"{PREFIX}_pd_transfer_seconds", "Time spent moving KV from prefill workers", value=pd["transfer_s"]
    )
    yield CounterMetricFamily(
        f"{PREFIX}_pd_transfer_tokens",
        "Prompt tokens whose KV came from prefill workers",
        value=pd["transfer_tokens"],
    )
    fallbacks = CounterMetricFamily(
        f"{PREFIX}_pd_fallbacks", "Prompts prefilled locally after a worker fault", labels=["reason"]
    )
    for reason, count in pd["fallbacks"].items():
        fallbacks.add_metric([reason], count)
    yield fallbacks
    yield CounterMetricFamily(f"{PREFIX}_pd_restarts", "Prefill worker restarts", value=pd["restarts"])


def pd_figures(stats: dict) -> dict:
    """The prefill workers' figures for the admin engine page (empty without workers)."""
    pd = stats.get("disaggregation") or {}
    if not pd:
        return {}
    return {
        "pd_workers_ready": f"{pd['workers_ready']} / {pd['workers']}",
        "pd_queue_depth": f"{pd['queue_depth']} / {pd['queue_capacity']}",
        "pd_imported_requests": pd["imported_requests"],
        "pd_transfer_bytes": pd["transfer_bytes"],
        "pd_transfer_us_per_token": round(pd["transfer_us_per_token"], 2),
        "pd_fallbacks": pd["fallbacks_total"],
        "pd_local_busy": pd["local_busy"],
        "pd_restarts": pd["restarts"],
    }


def _tier_families(tiers: dict[str, dict]) -> Iterator[Metric]:
    blocks = GaugeMetricFamily(
        f"{PREFIX}_kv_blocks", "KV blocks per tier and state", labels=["tier", "state"]
    )
    hits = CounterMetricFamily(
        f"{PREFIX}_kv_prefix_hit_tokens", "Prompt tokens served per tier", labels=["tier"]
    )
    moved = CounterMetricFamily(
        f"{PREFIX}_kv_bytes", "Bytes written to and read from a tier", labels=["tier", "direction"]
    )
    for tier, t in tiers.items():
        if tier == "pool":
            blocks.add_metric([tier, "used"], t["used_blocks"])
            blocks.add_metric([tier, "cached"], t["cached_blocks"])
            blocks.add_metric([tier, "free"], t["free_blocks"])
        else:
            # Lower tiers hold only cached blocks (nothing runs from them).
            blocks.add_metric([tier, "used"], 0)
            blocks.add_metric([tier, "cached"], t["blocks"])
            blocks.add_metric([tier, "free"], max(0, t["capacity_blocks"] - t["blocks"]))
            moved.add_metric([tier, "written"], t["bytes_written"])
            moved.add_metric([tier, "read"], t["bytes_read"])
        hits.add_metric([tier], t["hit_tokens"])
    yield blocks
    yield hits
    yield moved


_registry = CollectorRegistry(auto_describe=False)
_registry.register(EngineCollector())


def _has_token(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


def _is_staff(user) -> bool:
    return user.is_authenticated and user.is_active and user.is_staff


def _allowed(request: HttpRequest) -> bool:
    return _has_token(request) or _is_staff(request.user)


async def may_see_figures(request: HttpRequest) -> bool:
    """``/metrics``' rule for async views (``/healthz``): the token, else a staff session
    (the token first, so a scraper's poll costs no session lookup)."""
    return _has_token(request) or _is_staff(await request.auser())


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse("metrics need a staff session or the metrics token\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)


def live_stats() -> dict:
    """The figures the admin page plots (one sample; the page keeps the history)."""
    status = engine_status()
    stats = status.get("stats") or {}
    tiers = stats.get("kv_tiers", {})
    queried = stats.get("prefix_queried_tokens", 0)
    return {
        "stats": {k: v for k, v in stats.items() if not isinstance(v, dict)},
        "state": status.get("state"),
        "model": status.get("model"),
        "tokens_per_s": stats.get("tokens_per_s", 0.0),
        "running": stats.get("running", 0),
        "waiting": stats.get("waiting", 0),
        "loading": stats.get("loading", 0),
        "preemptions": stats.get("num_preemptions", 0),
        "swaps": stats.get("num_swaps", 0),
        "requests_by_outcome": stats.get("requests_by_outcome", {}),
        "hit_rate": stats.get("prefix_hit_rate", 0.0),
        "hit_tokens": stats.get("prefix_hit_tokens", 0),
        "queried_tokens": queried,
        **pd_figures(stats),
        "tiers": {
            name: {
                "blocks": t.get("blocks", 0),
                "capacity_blocks": t.get("capacity_blocks", 0),
                # The pool's use is what running requests hold; a lower tier's, what it stores.
                "use": t.get("used_blocks", t.get("blocks", 0)) / t["capacity_blocks"]
                if t.get("capacity_blocks")
                else 0.0,
                "hit_tokens": t.get("hit_tokens", 0),
                "bytes_written": t.get("bytes_written", 0),
                "bytes_read": t.get("bytes_read", 0),
            }
            for name, t in tiers.items()
        },
    }


@never_cache
def live_stats_json(request: HttpRequest) -> JsonResponse:
    """For the admin's engine page (staff only; the admin URL wraps it)."""
    return JsonResponse(live_stats())
