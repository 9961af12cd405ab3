"""The prefill workers' figures in /metrics and on the admin engine page."""

from __future__ import annotations

import pytest
import torch
from django.contrib.auth import get_user_model
from prometheus_client.parser import text_string_to_metric_families

from inference.engine.metrics import EngineMetrics
from inference.engine.outputs import EngineStats
from inference.kv.block_manager import BlockManager
from inference.pd.scheduler import DisaggregatedScheduler
from inference.pd.workers import WorkerPool


@pytest.fixture
def staff_client(client, db):
    admin = get_user_model().objects.create_superuser(
        "root", "root@example.com", "a-long-unusual-passphrase-42"
    )
    client.force_login(admin)
    return client


def _status_with_workers() -> dict:
    # A scheduler over a pool of no processes gives the real figures' shape.
    scheduler = DisaggregatedScheduler(
        BlockManager(8, 16),
        64,
        4,
        128,
        kv_cache=torch.zeros(8, 16),
        workers=WorkerPool([], 2, 60.0),
        min_prompt_tokens=256,
    )
    scheduler.transfer.bytes, scheduler.transfer.tokens, scheduler.transfer.seconds = 4096, 32, 0.002
    scheduler.transfer.fallbacks["error"] = 1
    histograms = EngineMetrics()
    stats = EngineStats(
        ttft=histograms.ttft.as_dict(),
        tpot=histograms.tpot.as_dict(),
        disaggregation=scheduler.disaggregation_stats(),
    ).as_dict()
    return {"state": "ready", "model": "tiny", "stats": stats}


@pytest.fixture
def engine_with_workers(monkeypatch):
    import conversations.ops.admin as admin
    import conversations.ops.metrics as metrics

    monkeypatch.setattr(metrics, "engine_status", _status_with_workers)
    monkeypatch.setattr(admin, "engine_status", _status_with_workers)


@pytest.mark.django_db
def test_metrics_export_the_prefill_workers(staff_client, engine_with_workers):
    text = staff_client.get("/metrics").content.decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    assert found["chatsite_engine_pd_queue_depth"].samples[0].value == 0
    assert found["chatsite_engine_pd_transfer_bytes"].samples[0].value == 4096
    assert found["chatsite_engine_pd_transfer_tokens"].samples[0].value == 32
    fallbacks = {s.labels["reason"]: s.value for s in found["chatsite_engine_pd_fallbacks"].samples}
    assert fallbacks["error"] == 1 and {"dead", "timeout", "hung", "mismatch"} <= set(fallbacks)
    assert "chatsite_engine_pd_restarts" in found and "chatsite_engine_pd_workers" in found


@pytest.mark.django_db
def test_engine_page_shows_the_prefill_workers(staff_client, engine_with_workers):
    page = staff_client.get("/admin/conversations/enginestatus/").content.decode()
    assert "Prefill queue depth" in page and "Prefill fallbacks" in page and "KV bytes from workers" in page
    live = staff_client.get("/admin/conversations/enginestatus/live/").json()
    assert (
        live["pd_queue_depth"] == "0 / 0" and live["pd_fallbacks"] == 1 and live["pd_transfer_bytes"] == 4096
    )


@pytest.mark.django_db
def test_prefill_workers_refuse_a_custom_loader_with_a_clear_error(settings):
    from conversations.ops import engine_handle

    engine_handle.reset_engine_for_tests()
    settings.ENGINE = {**settings.ENGINE, "prefill_workers": 1}
    settings.ENGINE_LOADER = "tests.support.slow_model.slow_tiny_model"
    try:
        with pytest.raises(
            engine_handle.EngineLoadError,
            match="ValueError: ENGINE_PREFILL_WORKERS needs the model of ENGINE_MODEL",
        ):
            engine_handle.get_engine()
        status = engine_handle.engine_status()
        assert status["state"] == "error" and "ENGINE_LOADER" in status["error"]
    finally:
        engine_handle.reset_engine_for_tests()
