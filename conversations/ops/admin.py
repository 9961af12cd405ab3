"""Admin: a read-only "Engine status" page of the engine's live numbers."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path, reverse

from conversations.audit.admin import AuditedAdmin
from conversations.models import EngineStatus
from conversations.ops.engine_handle import engine_status
from conversations.ops.metrics import live_stats_json, pd_figures


@admin.register(EngineStatus)
class EngineStatusAdmin(AuditedAdmin):
    """A read-only page of the engine's live numbers (never loads the model itself)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    def get_urls(self):
        live = path(
            "live/", self.admin_site.admin_view(self.live_view), name="conversations_enginestatus_live"
        )
        return [live, *super().get_urls()]

    def live_view(self, request):
        """The page's figures as JSON, polled by static/js/engine_status.js."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return live_stats_json(request)

    def changelist_view(self, request, extra_context=None):
        status = engine_status()
        stats = status.get("stats") or {}
        rows = [
            ("State", status.get("state", ""), "state"),
            ("Model", status.get("model", "—"), "model"),
            ("Running requests", stats.get("running", "—"), "running"),
            ("Waiting requests", stats.get("waiting", "—"), "waiting"),
            ("Loading KV requests", stats.get("loading", "—"), "loading"),
            ("KV blocks total", stats.get("kv_blocks_total", "—"), "kv_blocks_total"),
            ("KV blocks used", stats.get("kv_blocks_used", "—"), "kv_blocks_used"),
            ("KV blocks cached", stats.get("kv_blocks_cached", "—"), "kv_blocks_cached"),
            ("KV blocks free", stats.get("kv_blocks_free", "—"), "kv_blocks_free"),
            ("Prefix cache hit rate", _percent(stats.get("prefix_hit_rate")), "prefix_hit_rate"),
            ("Prefix hit tokens", stats.get("prefix_hit_tokens", "—"), "prefix_hit_tokens"),
            ("Tokens per second", _number(stats.get("tokens_per_s")), "tokens_per_s"),
            ("Preemptions", stats.get("num_preemptions", "—"), "num_preemptions"),
            ("Swaps", stats.get("num_swaps", "—"), "num_swaps"),
        ]
        rows += [
            (PD_LABELS[key], value, key) for key, value in pd_figures(stats).items()
        ]  # prefill workers, when the engine has them
        shown = {key for _, _, key in rows}
        # Structured figures (histograms, per-tier and per-outcome tables) have their own
        # places: the tiers table, /metrics.
        shown |= {"requests_by_outcome", "ttft", "tpot", "kv_tiers", "extra", "disaggregation"}
        extra = [(key.replace("_", " "), value) for key, value in stats.items() if key not in shown]
        extra += [(key.replace("_", " "), value) for key, value in stats.get("extra", {}).items()]
        extra += [(f"requests {k}", v) for k, v in stats.get("requests_by_outcome", {}).items()]
        context = {
            **self.admin_site.each_context(request),
            "title": "Engine status",
            "opts": self.model._meta,
            "rows": rows,
            "extra_rows": extra,
            "error": status.get("error"),
            "live_url": reverse("admin:conversations_enginestatus_live"),
            "poll_seconds": 2,
        }
        return TemplateResponse(request, "admin/engine_status.html", context)


PD_LABELS = {
    "pd_workers_ready": "Prefill workers ready",
    "pd_queue_depth": "Prefill queue depth",
    "pd_imported_requests": "Prompts prefilled by workers",
    "pd_transfer_bytes": "KV bytes from workers",
    "pd_transfer_us_per_token": "KV transfer µs per token",
    "pd_fallbacks": "Prefill fallbacks (worker faults)",
    "pd_local_busy": "Long prompts prefilled locally (workers busy)",
    "pd_restarts": "Prefill worker restarts",
}


def _percent(value) -> str:
    return f"{value * 100:.1f} %" if isinstance(value, int | float) else "—"


def _number(value) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "—"
