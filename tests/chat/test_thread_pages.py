"""The thread over the socket in pages that each fit one frame: the newest page first, older
ones on ``earlier``; a text over an eighth of a frame sent cut and fetched whole over HTTP; and
an event that cannot fit closes the socket with an error rather than vanishing."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from conversations.models import Conversation, Message
from tests.chat.conftest import Socket
from tests.workspace.conftest import signed_in

pytestmark = pytest.mark.django_db(transaction=True)


def path_conversation(owner, texts: list[str], **fields) -> tuple[Conversation, list[int]]:
    conversation = Conversation.objects.create(owner=owner, **fields)
    parent, ids = None, []
    for i, text in enumerate(texts):
        parent = Message.objects.create(
            conversation=conversation, parent=parent, role="user" if i % 2 == 0 else "assistant", content=text
        )
        ids.append(parent.pk)
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=parent)
    return conversation, ids


async def test_the_thread_comes_newest_first_and_earlier_pages_on_request(settings):
    settings.CHAT_THREAD_PAGE_MESSAGES = 40
    alice = await sync_to_async(get_user_model().objects.create)(username="alice")
    conversation, ids = await sync_to_async(path_conversation)(alice, [f"m{i}" for i in range(100)])
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    thread, _ = await socket.until("thread")
    assert [m["id"] for m in thread["messages"]] == ids[60:] and thread["earlier"] == 60
    await socket.send(type="earlier", conversation_id=conversation.pk, before_id=ids[60])
    page, _ = await socket.until("earlier")
    assert [m["id"] for m in page["messages"]] == ids[20:60]
    assert (page["before_id"], page["earlier"]) == (ids[60], 20)
    await socket.send(type="earlier", conversation_id=conversation.pk, before_id=ids[20])
    page, _ = await socket.until("earlier")
    assert [m["id"] for m in page["messages"]] == ids[:20] and page["earlier"] == 0
    # A message of no conversation of hers: an error, the socket stays open.
    await socket.send(type="earlier", conversation_id=conversation.pk, before_id=10**9)
    error, _ = await socket.until("error")
    assert error["code"] == "not_found"
    await socket.close()


async def test_a_page_keeps_to_its_byte_budget_and_a_long_text_is_cut_then_fetched_whole():
    alice = await sync_to_async(get_user_model().objects.create)(username="alice")
    long_answer = "é" * 400_000  # 800 KB of UTF-8: over an eighth of a frame
    texts = ["q" * 100_000, "a" * 100_000] * 3 + ["Last question", long_answer]
    conversation, ids = await sync_to_async(path_conversation)(alice, texts)
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    thread, _ = await socket.until("thread")
    messages = thread["messages"]
    assert messages[-1]["id"] == ids[-1] and messages[-1]["truncated"] == ["content"]
    assert (
        long_answer.startswith(messages[-1]["content"]) and len(messages[-1]["content"].encode()) <= 131_072
    )
    assert 2 <= len(messages) < len(ids) and thread["earlier"] == len(ids) - len(messages)
    await socket.close()

    whole = await sync_to_async(lambda: signed_in(alice).get(f"/chat/messages/{ids[-1]}/text/").json())()
    assert whole["content"] == long_answer
    bob = await sync_to_async(get_user_model().objects.create)(username="bob")
    assert (
        await sync_to_async(lambda: signed_in(bob).get(f"/chat/messages/{ids[-1]}/text/").status_code)()
        == 404
    )


async def test_an_event_over_the_frame_limit_closes_the_socket_with_an_error():
    alice = await sync_to_async(get_user_model().objects.create)(username="alice")
    conversation, _ = await sync_to_async(path_conversation)(
        alice, ["Hi", "Hello."], system_prompt="p" * 2_000_000
    )
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=conversation.pk)
    error = await socket.receive()
    assert error["type"] == "error" and error["code"] == "send_failed" and "too large" in error["detail"]
    closed = await socket.communicator.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4500}
