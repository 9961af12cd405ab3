"""The real default model (SmolLM2-135M-Instruct) answering a chat message over the websocket."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from conversations.models import Conversation, Message
from tests.chat.conftest import Socket


@pytest.fixture
def default_engine():
    """The process's engine on the default model (ENGINE_MODEL unset), for this test only."""
    from conversations.ops.engine_handle import reset_engine_for_tests

    original = settings.ENGINE
    settings.ENGINE = {**original, "model": None}
    reset_engine_for_tests()
    yield
    reset_engine_for_tests()
    settings.ENGINE = original


@pytest.mark.smoke
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
async def test_the_default_model_answers_a_chat_message(default_engine, make_user):
    user = await sync_to_async(make_user)("smoke")
    conversation = await Conversation.objects.acreate(owner=user, temperature=0.0, max_tokens=24)
    socket = await Socket.open(user)
    await socket.send(type="send", conversation_id=conversation.pk, content="What is the capital of France?")
    answer, events = await socket.finished(timeout=300)
    assert answer["status"] == "complete", answer
    assert "paris" in answer["content"].lower()
    assert sum(1 for e in events if e["type"] == "delta") >= 2
    saved = await Message.objects.aget(pk=answer["id"])
    assert saved.model_name and saved.token_ids and saved.content == answer["content"]
    await socket.close()
