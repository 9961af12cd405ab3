"""A temporary chat stays out of everything that keeps or reuses text: the built-in search
tool, ratings, the ratings' JSONL export and a websocket ``fork`` (a permanent copy)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message, Rating
from conversations.tools.search import search_conversations
from conversations.workspace.preferences import render_jsonl
from tests.chat.conftest import Socket
from tests.workspace.conftest import finish, post_json, signed_in


def chat_with(owner, text: str, *, temporary: bool) -> Message:
    """A conversation of ``owner`` with one question and its finished answer ``text``."""
    conversation = Conversation.objects.create(owner=owner, temporary=temporary)
    _, answer = tree_ops.send_message(conversation, f"Question about {text}")
    return finish(answer, text)


@pytest.mark.django_db
def test_the_search_tool_never_finds_a_temporary_chat(alice):
    chat_with(alice, "the temporary launch code 9051", temporary=True)
    chat_with(alice, "the kept launch plan", temporary=False)
    # What the built-in server's search_conversations tool answers for alice.
    hits = search_conversations(alice.pk, "launch", limit=10)
    snippets = " ".join(hit["snippet"] for hit in hits)
    assert "kept launch plan" in snippets and "9051" not in snippets


@pytest.mark.django_db
def test_a_temporary_chats_answer_cannot_be_rated(alice):
    answer = chat_with(alice, "a passing thought", temporary=True)
    reply = post_json(signed_in(alice), f"/chat/messages/{answer.pk}/rate/", {"value": 1})
    assert reply.status_code == 404
    assert not Rating.objects.exists()


@pytest.mark.django_db
def test_the_jsonl_export_leaves_out_a_temporary_chats_ratings(alice):
    """Ratings written on a temporary chat by any path (an older site, the admin) are not exported."""
    temporary = chat_with(alice, "temporary secret", temporary=True)
    kept = chat_with(alice, "kept answer", temporary=False)
    for message in (temporary, kept):
        Rating.objects.create(message=message, value=1)
    exported = render_jsonl(Rating.objects.select_related("message", "message__conversation")).decode()
    assert "kept answer" in exported and "temporary secret" not in exported


@database_sync_to_async
def conversations_of(user) -> list[bool]:
    return list(Conversation.all_objects.filter(owner=user).values_list("temporary", flat=True))


@pytest.mark.django_db(transaction=True)
async def test_a_websocket_fork_of_a_temporary_chat_is_refused(alice):
    answer = await sync_to_async(chat_with)(alice, "not to be kept", temporary=True)
    socket = await Socket.open(alice)
    await socket.send(type="fork", message_id=answer.pk)
    error, _ = await socket.until("error")
    assert error["code"] == "temporary" and "temporary chat" in error["detail"]
    await socket.send(type="ping")
    await socket.until("pong")  # the socket stays open
    assert await conversations_of(alice) == [True]  # no permanent copy
    await socket.close()
