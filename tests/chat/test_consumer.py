"""The chat websocket on the real engine (tiny random model): streaming, stop, branches,
reconnecting within the grace period, abort after it, and other users' ids."""

from __future__ import annotations

import asyncio
import gc

import pytest
from asgiref.sync import sync_to_async

from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine
from tests.chat.conftest import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tiny_engine")]

SHORT = {"temperature": 0.0, "max_tokens": 24}
LONG = {"temperature": 0.0, "max_tokens": 1500}


@pytest.fixture
async def alice(make_user):
    return await sync_to_async(make_user)("alice")


@pytest.fixture
def conversation_for(make_conversation):
    async def make(user, **fields):
        return await sync_to_async(make_conversation)(user, **fields)

    return make


async def opened(user, conversation) -> tuple[Socket, dict]:
    socket = await Socket.open(user)
    await socket.send(type="open", conversation_id=conversation.pk)
    thread, _ = await socket.until("thread")
    return socket, thread


async def send_and_wait(socket: Socket, conversation, text: str) -> tuple[dict, dict, list[dict]]:
    """Send ``text``; returns the thread shown right after, the finished answer, all events."""
    await socket.send(type="send", conversation_id=conversation.pk, content=text)
    thread, _ = await socket.until("thread")
    answer, events = await socket.finished(thread["messages"][-1]["id"])
    return thread, answer, events


async def get_message(pk: int) -> Message:
    return await Message.objects.aget(pk=pk)


async def test_send_streams_the_answer_token_by_token_and_saves_it(alice, conversation_for):
    conversation = await conversation_for(alice, system_prompt="You are terse.", **SHORT)
    socket, thread = await opened(alice, conversation)
    assert thread["messages"] == []
    thread, answer, events = await send_and_wait(socket, conversation, "Hello there")
    assert [m["role"] for m in thread["messages"]] == ["user", "assistant"]
    assert thread["messages"][-1]["status"] == "streaming"
    deltas = [e["text"] for e in events if e["type"] == "delta"]
    assert len(deltas) >= 2
    assert answer["status"] == "complete" and answer["content"] == "".join(deltas)

    saved = await get_message(answer["id"])
    assert saved.content == answer["content"] and saved.status == Message.Status.COMPLETE
    assert saved.token_ids and len(saved.token_ids) == saved.completion_tokens
    assert saved.prompt_tokens > 0 and saved.tokens_per_s and saved.time_to_first_token_ms is not None
    question = await get_message(saved.parent_id)
    assert question.token_ids  # the user's rendered turn, for the next prompt
    await socket.close()


async def test_the_next_turn_reuses_the_cached_prefix(alice, conversation_for):
    conversation = await conversation_for(alice, system_prompt="You are terse.", **SHORT)
    socket, _ = await opened(alice, conversation)
    _, first, _ = await send_and_wait(socket, conversation, "Hello there, how are you today?")
    _, second, _ = await send_and_wait(socket, conversation, "And tomorrow?")
    assert second["cached_tokens"] >= 16  # at least one full KV block of the first turn
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"]
    await socket.close()


async def test_stop_aborts_the_request_and_keeps_the_partial_answer(alice, conversation_for):
    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Talk for a long time")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    await socket.until("delta")
    await socket.send(type="stop", message_id=answer_id)
    answer, _ = await socket.finished(answer_id, timeout=10)
    assert answer["status"] == "interrupted" and answer["finish_reason"] == "abort"
    assert answer["content"] and 0 < answer["completion_tokens"] < LONG["max_tokens"]
    saved = await get_message(answer_id)
    assert saved.status == Message.Status.INTERRUPTED and saved.content == answer["content"]
    engine = await aget_engine()
    for _ in range(50):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.stats().running == 0
    await socket.close()


async def test_edit_regenerate_and_switch_branches(alice, conversation_for):
    conversation = await conversation_for(alice, **SHORT)
    socket, _ = await opened(alice, conversation)
    thread, first_answer, _ = await send_and_wait(socket, conversation, "Hello")
    question_id = thread["messages"][0]["id"]

    await socket.send(type="edit", message_id=question_id, content="Hello again")
    thread, _ = await socket.until("thread")
    edited = thread["messages"][0]
    assert edited["content"] == "Hello again"
    assert edited["siblings"] == [question_id, edited["id"]] and edited["sibling_index"] == 1
    edited_answer, _ = await socket.finished(thread["messages"][1]["id"])
    assert edited_answer["status"] == "complete"

    await socket.send(type="regenerate", message_id=edited_answer["id"])
    thread, _ = await socket.until("thread")
    regenerated = thread["messages"][-1]
    assert regenerated["siblings"] == [edited_answer["id"], regenerated["id"]]
    await socket.finished(regenerated["id"])

    await socket.send(type="switch", message_id=question_id)
    thread, _ = await socket.until("thread")
    assert [m["id"] for m in thread["messages"]] == [question_id, first_answer["id"]]
    assert thread["messages"][1]["content"] == first_answer["content"]
    assert thread["messages"][0]["sibling_index"] == 0

    await socket.send(type="switch", message_id=edited["id"])
    thread, _ = await socket.until("thread")
    assert [m["id"] for m in thread["messages"]] == [edited["id"], regenerated["id"]]

    await socket.send(type="delete", message_id=regenerated["id"])
    thread, _ = await socket.until("thread")
    assert [m["id"] for m in thread["messages"]] == [edited["id"], edited_answer["id"]]
    assert thread["messages"][1]["siblings"] == [edited_answer["id"]]
    await socket.close()


async def test_every_tab_watching_the_conversation_sees_the_stream(alice, conversation_for):
    conversation = await conversation_for(alice, **SHORT)
    first, _ = await opened(alice, conversation)
    second, _ = await opened(alice, conversation)
    await first.send(type="send", conversation_id=conversation.pk, content="Hello")
    answer, first_events = await first.finished()
    thread, _ = await second.until("thread")  # the other tab is told the tree changed
    seen, second_events = await second.finished(answer["id"])
    assert seen["content"] == answer["content"]
    streamed = "".join(e["text"] for e in second_events if e["type"] == "delta")
    assert streamed and answer["content"].endswith(streamed)
    await first.close()
    await second.close()


async def test_reconnecting_within_the_grace_period_gets_the_text_so_far_then_the_live_stream(
    alice, conversation_for, settings
):
    settings.GENERATION_GRACE_SECONDS = 30
    # Long enough that the answer is still streaming when the tab is back on a busy machine.
    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    await socket.until("delta")
    await socket.close()  # the tab reloads
    await asyncio.sleep(0.2)

    socket, thread = await opened(alice, conversation)
    resumed = thread["messages"][-1]
    assert resumed["id"] == answer_id and resumed["status"] == "streaming"
    assert resumed["content"]  # the text so far
    answer, events = await socket.finished(answer_id)
    assert any(e["type"] == "delta" for e in events)  # then the live stream
    assert answer["status"] == "complete" and answer["content"].startswith(resumed["content"])
    assert answer["content"] == resumed["content"] + "".join(
        e["text"] for e in events if e["type"] == "delta"
    )
    await socket.close()


async def test_with_nobody_back_after_the_grace_period_the_answer_is_aborted_and_saved_interrupted(
    alice, conversation_for, settings
):
    settings.GENERATION_GRACE_SECONDS = 0.3
    settings.PARTIAL_SAVE_SECONDS = 0.1
    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    await socket.until("delta")
    await socket.close()
    saved = await get_message(answer_id)
    for _ in range(200):
        saved = await get_message(answer_id)
        if saved.status != Message.Status.STREAMING:
            break
        await asyncio.sleep(0.05)
    assert saved.status == Message.Status.INTERRUPTED
    assert saved.content and 0 < saved.completion_tokens < LONG["max_tokens"]


async def test_partial_text_is_saved_while_streaming(alice, conversation_for, settings):
    settings.PARTIAL_SAVE_SECONDS = 0.1
    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    saved = await get_message(answer_id)
    for _ in range(100):
        saved = await get_message(answer_id)
        if saved.content:
            break
        await asyncio.sleep(0.05)
    assert saved.status == Message.Status.STREAMING and saved.content and saved.token_ids
    await socket.send(type="stop", message_id=answer_id)
    await socket.finished(answer_id)
    await socket.close()


async def test_a_message_too_long_for_the_context_shows_an_error_in_the_thread(alice, conversation_for):
    conversation = await conversation_for(alice, **SHORT)
    socket, _ = await opened(alice, conversation)
    _, answer, _ = await send_and_wait(socket, conversation, "word " * 3000)
    assert answer["status"] == "error" and "too long" in answer["error"]
    saved = await get_message(answer["id"])
    assert saved.status == Message.Status.ERROR and saved.error == answer["error"]
    await socket.close()


async def test_a_long_history_is_cut_and_the_answer_says_how_much(alice, conversation_for):
    conversation = await conversation_for(alice, **SHORT)

    def build():
        parent = None
        for i in range(40):
            user = Message.objects.create(
                conversation=conversation, parent=parent, role="user", content=f"q{i} " * 40
            )
            parent = Message.objects.create(
                conversation=conversation, parent=user, role="assistant", content=f"a{i} " * 40
            )
        Conversation.objects.filter(pk=conversation.pk).update(current_leaf=parent)

    await sync_to_async(build)()
    socket, _ = await opened(alice, conversation)
    _, answer, _ = await send_and_wait(socket, conversation, "And?")
    assert answer["status"] == "complete" and answer["context_dropped"] >= 2
    assert (await get_message(answer["id"])).context_dropped == answer["context_dropped"]
    await socket.close()


async def test_another_users_conversation_id_closes_the_socket(alice, conversation_for, make_user):
    conversation = await conversation_for(alice)
    bob = await sync_to_async(make_user)("bob")
    socket = await Socket.open(bob)
    await socket.send(type="open", conversation_id=conversation.pk)
    closed = await socket.communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4404}

    socket = await Socket.open(bob)
    await socket.send(type="send", conversation_id=conversation.pk, content="let me in")
    closed = await socket.communicator.receive_output(timeout=5)
    assert closed["type"] == "websocket.close" and closed["code"] == 4404
    assert await Message.objects.filter(conversation=conversation).acount() == 0


async def test_another_users_conversation_url_refuses_the_socket(alice, conversation_for, make_user):
    from tests.conftest import websocket

    conversation = await conversation_for(alice)
    bob = await sync_to_async(make_user)("bob")
    communicator = await sync_to_async(websocket)(f"/ws/chat/{conversation.pk}/", bob)
    connected, code = await communicator.connect(timeout=10)
    assert not connected and code == 4404
    communicator = await sync_to_async(websocket)(f"/ws/chat/{conversation.pk}/", alice)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    thread = await communicator.receive_json_from(timeout=10)
    assert thread["type"] == "thread" and thread["conversation"]["id"] == conversation.pk
    await communicator.disconnect()


async def test_a_second_question_while_an_answer_streams_is_refused(alice, conversation_for):
    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    await socket.until("delta")
    await socket.send(type="send", conversation_id=conversation.pk, content="And another thing")
    error, _ = await socket.until("error")
    assert "still being written" in error["detail"]
    await socket.send(type="stop", message_id=answer_id)
    await socket.finished(answer_id)
    assert await Message.objects.filter(conversation=conversation).acount() == 2
    await socket.close()


async def test_stop_cannot_touch_another_users_answer(alice, conversation_for, make_user):
    conversation = await conversation_for(alice, **LONG)
    bob = await sync_to_async(make_user)("bob")
    bobs = await conversation_for(bob)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    thread, _ = await socket.until("thread")
    answer_id = thread["messages"][-1]["id"]
    await socket.until("delta")
    intruder, _ = await opened(bob, bobs)
    await intruder.send(type="stop", conversation_id=bobs.pk, message_id=answer_id)
    await intruder.send(type="ping")
    await intruder.until("pong")
    for _ in range(5):  # still streaming (the sidebar's news may come in between)
        _, seen = await socket.until("delta", message_id=answer_id)
        assert {e["type"] for e in seen} <= {"delta", "conversations"}
    await socket.send(type="stop", message_id=answer_id)
    answer, _ = await socket.finished(answer_id)
    assert answer["status"] == "interrupted"
    await socket.close()
    await intruder.close()


async def test_deleting_the_conversation_over_http_stops_its_answer_and_tells_the_tab(
    alice, conversation_for
):
    from django.test import Client

    conversation = await conversation_for(alice, **LONG)
    socket, _ = await opened(alice, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Keep going")
    await socket.until("delta")

    def delete():
        client = Client()
        client.force_login(alice)
        return client.post(f"/chat/conversations/{conversation.pk}/delete/").status_code

    assert await sync_to_async(delete)() == 200
    event, _ = await socket.until("deleted")
    assert event["conversation_id"] == conversation.pk
    engine = await aget_engine()
    for _ in range(100):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.stats().running == 0
    # Hidden at once; its rows go when housekeeping purges it after the retention period.
    assert not await Conversation.objects.filter(pk=conversation.pk).aexists()
    await socket.close()


async def test_a_tab_served_by_another_process_refreshes_from_the_database_on_coarse_events(
    alice, conversation_for
):
    from channels.layers import get_channel_layer

    from conversations.chat import tree as tree_ops
    from conversations.chat.groups import conversation_group

    conversation = await conversation_for(alice)
    _, answer = await sync_to_async(tree_ops.send_message)(conversation, "Hello")
    socket, thread = await opened(alice, conversation)
    assert thread["messages"][-1]["content"] == ""
    await Message.objects.filter(pk=answer.pk).aupdate(content="saved by another process")
    await get_channel_layer().group_send(
        conversation_group(conversation.pk),
        {"type": "chat.event", "event": "progress", "process": "another-process", "message_id": answer.pk},
    )
    thread, _ = await socket.until("thread")
    assert thread["messages"][-1]["content"] == "saved by another process"
    await socket.close()


async def test_a_closed_tab_leaves_no_consumer_in_a_reference_cycle(alice, conversation_for, garbage):
    """Its sender task ends cancelled, holding a CancelledError whose traceback holds the
    consumer: the consumer lets go of the task as it cancels it."""
    from conversations.chat.consumers import ChatConsumer

    conversation = await conversation_for(alice)
    socket, _thread = await opened(alice, conversation)
    await socket.communicator.disconnect()
    del socket
    await asyncio.sleep(0.05)  # the cancelled sender finishes
    gc.collect()
    assert [o for o in garbage if isinstance(o, ChatConsumer)] == []
