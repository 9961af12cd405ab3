"""Health endpoints for load balancers and orchestrators: readiness and liveness.

Both answer anyone, so an anonymous caller learns only whether each check passes: error
text, the engine's statistics and which process answered are operational detail that
``/metrics`` guards, and go only to the callers it admits (a staff session or the
metrics token).
"""

from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from conversations.cluster.registry import PROCESS_ID
from conversations.cluster.registry import enabled as cluster_enabled
from conversations.ops.engine_handle import engine_status
from conversations.ops.health import channel_layer_ready, database_ready
from conversations.ops.metrics import may_see_figures


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 only when the database, the channel layer and the engine are ready,
    else 503 with the same JSON (a load balancer tells "starting" from "serving")."""
    (db_ok, db_detail), (layer_ok, layer_detail) = await asyncio.gather(
        database_ready(), channel_layer_ready()
    )
    engine = engine_status()
    checks = {"database": db_ok, "channel_layer": layer_ok, "engine": bool(engine["ready"])}
    ok = all(checks.values())
    body: dict = {"status": "ok" if ok else "unavailable", "checks": checks}
    if await may_see_figures(request):
        body["details"] = {
            "database": db_detail,
            "channel_layer": layer_detail,
            "engine": engine,
            # Which process answered (several may serve the site; see conversations.cluster.registry).
            "process": {"id": PROCESS_ID, "cluster": cluster_enabled()},
        }
    return JsonResponse(body, status=200 if ok else 503)


@never_cache
def health(request: HttpRequest) -> HttpResponse:
    """vLLM's ``GET /health``, which its clients (guidellm, vLLM's own benchmarks) check before
    any request: 200 with an empty body while this process can serve, 503 once its engine
    failed to load or shut down. Status only, as vLLM answers; ``/healthz`` has the checks."""
    state = engine_status()["state"]
    return HttpResponse(status=503 if state in ("error", "stopped") else 200)


@never_cache
def livez(request: HttpRequest) -> JsonResponse:
    """Liveness: 200 as long as the process serves HTTP; checks nothing else."""
    return JsonResponse({"status": "ok"})
