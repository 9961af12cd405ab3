"""Reasoning answers in the chat, without a browser: the websocket streams the thinking
as ``delta.reasoning`` apart from the answer text, the message stores it with how long
the model thought, the thread shows it, and the next turn's prompt leaves it out."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from conversations.models import Message
from tests.chat.conftest import Socket
from tests.support.fakes import SCRIPTED_ANSWER, SCRIPTED_REASONING, scripted_reasoning_model

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reasoning_engine(monkeypatch):
    """The process's engine replaced by one over a model whose template marks reasoning
    (it answers every prompt with a fixed think + answer); prompts are recorded."""
    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(device="cpu", num_kv_blocks=32), loaded=scripted_reasoning_model())
    prompts: list[list[int]] = []
    submit = engine.submit  # every request's way in, the chat's and stream()'s

    def recording_submit(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return submit(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "submit", recording_submit)
    from conversations.ops import engine_handle

    monkeypatch.setattr(engine_handle.slot_for(None), "engine", engine)
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
    from conversations.chat.socket_base import merge_deltas

    first = {"type": "delta", "message_id": 1, "text": "", "reasoning": "Count sheep"}
    second = {"type": "delta", "message_id": 1, "text": "", "reasoning": " quickly."}
    third = {"type": "delta", "message_id": 1, "text": "Paris"}
    merged = merge_deltas(merge_deltas(first, second), third)
    assert merged == {"type": "delta", "message_id": 1, "text": "Paris", "reasoning": "Count sheep quickly."}
    assert "reasoning" not in merge_deltas(third, third)


def test_relayed_pieces_add_new_text_and_reasoning_ignore_repeats_and_report_gaps():
    from conversations.cluster.relay import Shown, behind, take

    shown = Shown(text=3, reasoning=5)  # "Par" and "Count" shown already
    piece = {"offset": 3, "text": "is", "reasoning_offset": 5, "reasoning": " sheep"}
    assert take(shown, piece) == {"text": "is", "reasoning": " sheep"}
    assert shown == Shown(5, 11)
    assert take(shown, piece) == {"text": ""}  # a repeat adds nothing
    overlapping = {"offset": 3, "text": "is!", "reasoning_offset": 5, "reasoning": " sheep."}
    assert take(shown, overlapping) == {"text": "!", "reasoning": "."}
    assert take(shown, {"offset": 6, "text": "?", "reasoning_offset": 30, "reasoning": "x"}) is None
    assert take(shown, {"offset": 9, "text": "?", "reasoning_offset": 12, "reasoning": ""}) is None
    assert shown == Shown(6, 12)  # a gap takes nothing
    assert take(shown, {"offset": 6, "text": " ok"}) == {"text": " ok"}  # text-only pieces still count
    assert not behind(shown, {"length": 9, "reasoning_length": 12})
    assert behind(shown, {"length": 9, "reasoning_length": 13}) and behind(shown, {"length": 10})


async def test_a_tab_follows_the_reasoning_an_owner_elsewhere_relays_and_asks_it_to_fill_gaps(
    monkeypatch, make_user, make_conversation
):
    """The consumer's side of the relay: the owner is another process, played here by
    events sent straight to the conversation's group and by reading its channel."""
    from channels.layers import get_channel_layer

    from conversations.chat.groups import conversation_group
    from conversations.cluster import registry as cluster

    owner = "another-process"
    layer = get_channel_layer()
    owner_channel = await layer.new_channel()
    monkeypatch.setattr("conversations.chat.tab_view.SNAPSHOT_RETRY_SECONDS", 0.0)

    async def processes() -> dict:
        return {owner: cluster.ProcessInfo(owner, channel=owner_channel, ready=True)}

    async def liveness() -> cluster.Liveness:
        return cluster.Liveness({cluster.PROCESS_ID, owner}, {cluster.PROCESS_ID, owner})

    monkeypatch.setattr("conversations.chat.service.live_processes", processes)
    monkeypatch.setattr("conversations.chat.tab_view.live_processes", processes)
    monkeypatch.setattr(cluster, "liveness", liveness)

    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(alice)
    question = await Message.objects.acreate(conversation=conversation, role="user", content="Capital?")
    answer = await Message.objects.acreate(
        conversation=conversation,
        parent=question,
        role="assistant",
        status=Message.Status.STREAMING,
        owner_process=owner,
        content="",
        reasoning="Count",  # saved so far by the owner
    )
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    thread, _ = await socket.until("thread")
    assert thread["messages"][-1]["reasoning"] == "Count"
    asked = await layer.receive(owner_channel)  # the tab asks the owner for the text so far
    assert (asked["type"], asked["message_id"]) == ("chat.snapshot", answer.pk)

    async def relay(event: str, **fields) -> None:
        message = {"type": "chat.event", "event": event, "process": owner, "message_id": answer.pk, **fields}
        await layer.group_send(conversation_group(conversation.pk), message)

    await relay("delta", offset=0, text="", reasoning_offset=5, reasoning=" sheep")
    delta, _ = await socket.until("delta")
    assert (delta["text"], delta["reasoning"]) == ("", " sheep")
    await relay("delta", offset=0, text="", reasoning_offset=5, reasoning=" sheep")  # a repeat
    # Thinking past what the tab shows (it missed " quickl"): the owner is asked for a snapshot.
    await relay("delta", offset=0, text="", reasoning_offset=18, reasoning="y.")
    asked = await layer.receive(owner_channel)
    assert (asked["type"], asked["message_id"]) == ("chat.snapshot", answer.pk)
    snapshot = {"offset": 0, "text": "Paris", "reasoning_offset": 0, "reasoning": SCRIPTED_REASONING}
    await layer.send(
        asked["reply"],
        {"type": "chat.event", "event": "snapshot", "process": owner, "message_id": answer.pk, **snapshot},
    )
    # The next delta is the snapshot's missing part: the repeat and the gap showed nothing.
    delta, _ = await socket.until("delta")
    assert (delta["text"], delta["reasoning"]) == ("Paris", " quickly.")
    # A heartbeat saying the owner has written more thinking than shown asks again.
    await relay("heartbeat", length=5, reasoning_length=len(SCRIPTED_REASONING) + 3)
    await socket.until("heartbeat")
    asked = await layer.receive(owner_channel)
    assert (asked["type"], asked["message_id"]) == ("chat.snapshot", answer.pk)
    await socket.close()
