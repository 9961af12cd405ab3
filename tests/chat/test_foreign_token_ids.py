"""Stored token ids the model cannot take (out of its vocabulary, yet stored under its own
fingerprint, so the prompt reuses them) fail only the answer whose prompt holds them: the
engine refuses them at admission, the answer ends with an error in its thread, and an answer
streaming in another conversation meanwhile completes. (Ids stored under another model's
fingerprint are never reused: ``test_prompt_history``.)"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from conversations.chat.token_fingerprint import token_fingerprint
from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine
from tests.chat.conftest import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tiny_engine")]


@pytest.fixture
async def alice(make_user):
    return await sync_to_async(make_user)("alice")


async def test_an_answer_over_ids_of_another_model_fails_alone_while_another_streams_on(
    alice, make_conversation
) -> None:
    engine = await aget_engine()
    vocab = engine.engine.model_config.vocab_size
    fingerprint = token_fingerprint(engine.model_name, engine.tokenizer)

    def build() -> tuple[Conversation, Conversation]:
        streaming = make_conversation(alice, temperature=0.0, max_tokens=300)
        stale = make_conversation(alice, temperature=0.0, max_tokens=8)
        question = Message.objects.create(conversation=stale, role="user", content="Hello")
        answer = Message.objects.create(
            conversation=stale,
            parent=question,
            role="assistant",
            content="Hi there",
            token_ids=[vocab + 17, 42],  # damaged: no tokenizer of this model makes them
            token_fingerprint=fingerprint,
            model_name=engine.model_name,
        )
        Conversation.objects.filter(pk=stale.pk).update(current_leaf=answer)
        return streaming, stale

    streaming, stale = await sync_to_async(build)()
    first = await Socket.open(alice)
    await first.send(type="open", conversation_id=streaming.pk)
    await first.until("thread")
    await first.send(type="send", conversation_id=streaming.pk, content="Tell me a long story")
    thread, _ = await first.until("thread")
    long_answer_id = thread["messages"][-1]["id"]
    await first.until("delta")  # streaming now

    second = await Socket.open(alice)
    failed = await second.open_and_ask(stale.pk, "And again?")
    assert failed["status"] == "error"
    assert "token the current model does not know" in failed["error"] and str(vocab + 17) in failed["error"]
    saved = await Message.objects.aget(pk=failed["id"])
    assert saved.status == Message.Status.ERROR and saved.error == failed["error"]

    assert (await Message.objects.aget(pk=long_answer_id)).status == Message.Status.STREAMING
    finished, _ = await first.finished(long_answer_id, timeout=60)
    assert finished["status"] == "complete" and finished["completion_tokens"] > 0
    assert engine.stats().requests_by_outcome["error"] == 0
    await asyncio.gather(first.close(), second.close())
