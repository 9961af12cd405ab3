"""Reasoning answers in the chat, without a browser: the websocket streams the thinking
as ``delta.reasoning`` apart from the answer text, the message stores it with how long
the model thought, the thread shows it, and the next turn's prompt leaves it out."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from conversations.models import Message
from inference.testing import SCRIPTED_ANSWER, SCRIPTED_REASONING, scripted_reasoning_model
from tests.chat.conftest import Socket

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reasoning_engine(monkeypatch):
    """The process's engine replaced by one over a model whose template marks reasoning
    (it answers every prompt with a fixed think + answer); prompts are recorded."""
    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(device="cpu", num_kv_blocks=32), loaded=scripted_reasoning_model())
    prompts: list[list[int]] = []
    stream = engine.stream

    def recording_stream(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return stream(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "stream", recording_stream)
    monkeypatch.setattr("conversations.engine._engine", engine)
    yield engine, prompts
    engine.shutdown()


async def ask(socket: Socket, conversation_id: int, text: str) -> tuple[dict, dict, list[dict]]:
    """Send ``text``: the answer as the thread first shows it (live text so far), the finished
    answer, and the events after that thread (the deltas not already contained in it)."""
    await socket.send(type="send", conversation_id=conversation_id, content=text)
    thread, _ = await socket.until("thread")
    live = thread["messages"][-1]
    message, events = await socket.finished(live["id"])
    return live, message, events


async def test_reasoning_streams_apart_is_saved_and_stays_out_of_the_next_prompt(
    reasoning_engine, make_user, make_conversation
):
    engine, prompts = reasoning_engine
    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(alice, temperature=0.0, max_tokens=40)
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")

    live, message, events = await ask(socket, conversation.pk, "Capital of France?")
    deltas = [e for e in events if e["type"] == "delta"]
    assert live["reasoning"] + "".join(e.get("reasoning", "") for e in deltas) == SCRIPTED_REASONING
    assert live["content"] + "".join(e["text"] for e in deltas) == SCRIPTED_ANSWER
    first_answer = next((i for i, e in enumerate(deltas) if e["text"]), len(deltas))
    # The thinking streams first (one coalesced delta may end it and start the answer).
    assert not any("reasoning" in e for e in deltas[first_answer + 1 :])
    assert message["content"] == SCRIPTED_ANSWER and message["reasoning"] == SCRIPTED_REASONING
    assert isinstance(message["reasoning_seconds"], float) and message["reasoning_seconds"] >= 0
    saved = await Message.objects.aget(pk=message["id"])
    assert (saved.content, saved.reasoning) == (SCRIPTED_ANSWER, SCRIPTED_REASONING)
    assert saved.reasoning_seconds == message["reasoning_seconds"]

    await socket.send(type="open", conversation_id=conversation.pk)
    thread, _ = await socket.until("thread")
    shown = thread["messages"][-1]
    assert (shown["reasoning"], shown["reasoning_seconds"]) == (SCRIPTED_REASONING, saved.reasoning_seconds)
    assert thread["messages"][0]["reasoning"] == "" and thread["messages"][0]["reasoning_seconds"] is None

    await ask(socket, conversation.pk, "And of Spain?")
    second_prompt = engine.tokenizer.decode(prompts[-1], skip_special_tokens=False)
    assert SCRIPTED_ANSWER in second_prompt and SCRIPTED_REASONING not in second_prompt
    await socket.close()


def test_deltas_merged_for_a_slow_socket_keep_their_reasoning():
    from conversations.consumers import _merge_deltas

    first = {"type": "delta", "message_id": 1, "text": "", "reasoning": "Count sheep"}
    second = {"type": "delta", "message_id": 1, "text": "", "reasoning": " quickly."}
    third = {"type": "delta", "message_id": 1, "text": "Paris"}
    merged = _merge_deltas(_merge_deltas(first, second), third)
    assert merged == {"type": "delta", "message_id": 1, "text": "Paris", "reasoning": "Count sheep quickly."}
    assert "reasoning" not in _merge_deltas(third, third)
