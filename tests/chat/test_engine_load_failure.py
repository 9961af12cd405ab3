"""A model that cannot load: with ENGINE_PRELOAD the server does not start (one line says why
and what to check); without it, a chat turn fails with that reason and /healthz shows it to
the callers that may see details."""

from __future__ import annotations

from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from conversations.models import Conversation, Message
from conversations.ops.engine_handle import reset_engine_for_tests
from tests.chat.conftest import Socket
from tests.live_site import launch_live_site

pytestmark = pytest.mark.django_db(transaction=True)
METRICS_TOKEN = "a-metrics-token-for-the-load-failure"


@pytest.fixture
def missing_model(settings, tmp_path: Path):
    settings.ENGINE = {**settings.ENGINE, "model": str(tmp_path / "no-such-model")}
    settings.METRICS_TOKEN = METRICS_TOKEN
    reset_engine_for_tests()
    yield
    reset_engine_for_tests()


def test_with_preload_a_model_that_cannot_load_stops_the_start_with_one_line(tmp_path: Path) -> None:
    site = launch_live_site(tmp_path / "no-such-model", tmp_path)
    try:
        returncode = site.process.wait(timeout=120)
    finally:
        if site.process.poll() is None:
            site.process.kill()
    log = site.log()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert returncode == 1, log
    assert len(errors) == 1, log
    assert "ENGINE_PRELOAD: the model could not be loaded" in errors[0]
    assert "no-such-model" in errors[0] and "check ENGINE_MODEL" in errors[0]
    assert "Traceback" not in log


async def test_without_preload_the_first_turn_fails_with_the_reason(missing_model, make_user) -> None:
    alice = await sync_to_async(make_user)("alice")
    conversation = await Conversation.objects.acreate(owner=alice, temperature=0.0, max_tokens=8)
    socket = await Socket.open(alice)
    answer = await socket.open_and_ask(conversation.pk, "Hello")
    assert answer["status"] == "error"
    assert answer["error"].startswith("The model is not available: the model could not be loaded")
    assert "check ENGINE_MODEL" in answer["error"]
    saved = await Message.objects.aget(pk=answer["id"])
    assert saved.status == Message.Status.ERROR and saved.error == answer["error"]
    await socket.close()


def test_healthz_shows_the_reason_only_to_callers_that_may_see_details(missing_model) -> None:
    from conversations.ops.engine_handle import EngineLoadError, get_engine

    with pytest.raises(EngineLoadError, match="check ENGINE_MODEL"):
        get_engine()
    anonymous = Client().get("/healthz")
    assert anonymous.status_code == 503 and anonymous.json()["checks"]["engine"] is False
    assert "details" not in anonymous.json()
    detailed = Client().get("/healthz", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}").json()
    engine = detailed["details"]["engine"]
    assert engine["state"] == "error" and "no-such-model" in engine["error"]
    assert "check ENGINE_MODEL" in engine["error"]
