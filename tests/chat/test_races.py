"""Races and foreign ids on the chat websocket: one answer per conversation however the
sends race, and a message id that is not in this user's open conversation changes nothing."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from conversations.models import Conversation, Message
from tests.chat.conftest import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tiny_engine")]

LONG = {"temperature": 0.0, "max_tokens": 1500}


@pytest.fixture
async def alice(make_user):
    return await sync_to_async(make_user)("alice")


@pytest.fixture
async def bob(make_user):
    return await sync_to_async(make_user)("bob")


def _with_exchange(
    owner, question: str = "Hi", answer: str = "Hello"
) -> tuple[Conversation, Message, Message]:
    conversation = Conversation.objects.create(owner=owner, **LONG)
    user = Message.objects.create(conversation=conversation, role="user", content=question)
    reply = Message.objects.create(conversation=conversation, parent=user, role="assistant", content=answer)
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=reply)
    conversation.refresh_from_db()
    return conversation, user, reply


with_exchange = sync_to_async(_with_exchange)


@sync_to_async
def state_of(*conversations: Conversation) -> list:
    """Everything an operation could change: the messages and each conversation's pointers."""
    rows = []
    for conversation in conversations:
        conversation.refresh_from_db()
        rows.append((conversation.pk, conversation.current_leaf_id, conversation.active_root_id))
        rows += list(
            Message.objects.filter(conversation=conversation)
            .order_by("pk")
            .values_list("pk", "parent_id", "active_child_id", "content", "status")
        )
    return rows


async def opened(user, conversation) -> Socket:
    socket = await Socket.open(user)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")
    return socket


async def started_or_refused(socket: Socket) -> tuple[str, object]:
    while True:
        event = await socket.receive(timeout=30)
        if event["type"] == "error":
            return event["code"], event["detail"]
        if event["type"] == "thread" and event["messages"] and event["messages"][-1]["status"] == "streaming":
            return "started", event["messages"][-1]["id"]


@pytest.mark.smoke
async def test_two_tabs_sending_into_one_idle_conversation_at_once_start_exactly_one_answer(alice):
    conversation = await sync_to_async(Conversation.objects.create)(owner=alice, **LONG)
    first, second = await opened(alice, conversation), await opened(alice, conversation)
    await asyncio.gather(
        first.send(type="send", content="From the first tab"),
        second.send(type="send", content="From the second tab"),
    )
    outcomes = await asyncio.gather(started_or_refused(first), started_or_refused(second))
    assert sorted(kind for kind, _ in outcomes) == ["busy", "started"]
    assert await Message.objects.filter(conversation=conversation).acount() == 2
    assert await Message.objects.filter(conversation=conversation, status="streaming").acount() == 1

    (winner, answer_id), loser = (
        ((first, outcomes[0][1]), second)
        if outcomes[0][0] == "started"
        else ((second, outcomes[1][1]), first)
    )
    await loser.send(type="ping")  # the refused tab's socket stays open
    await loser.until("pong")
    await winner.send(type="stop", message_id=answer_id)
    await winner.finished(answer_id)
    await first.close()
    await second.close()


@pytest.mark.parametrize(
    "request_type",
    ["edit", "regenerate", "switch", "delete", "stop"],
)
async def test_a_message_outside_the_open_conversation_gets_an_error_and_changes_nothing(
    alice, bob, request_type
):
    mine, _, _ = await with_exchange(alice)
    other, other_question, other_answer = await with_exchange(alice, "Elsewhere", "There")
    bobs, bobs_question, bobs_answer = await with_exchange(bob, "Bob's", "Secret")
    before = await state_of(mine, other, bobs)
    socket = await opened(alice, mine)
    for foreign in (other_question.pk, other_answer.pk, bobs_question.pk, bobs_answer.pk, 10**9, "x", None):
        await socket.send(type=request_type, message_id=foreign, content="changed")
        error, _ = await socket.until("error")
        assert error["code"] == "not_found", (foreign, error)
    assert await state_of(mine, other, bobs) == before
    await socket.send(type="ping")
    await socket.until("pong")
    await socket.close()


@pytest.mark.smoke
async def test_a_parent_id_must_be_an_answer_in_that_conversation(alice, bob):
    mine, question, answer = await with_exchange(alice)
    other, _, other_answer = await with_exchange(alice, "Elsewhere", "There")
    bobs, _, bobs_answer = await with_exchange(bob)
    before = await state_of(mine, other, bobs)
    socket = await opened(alice, mine)
    for parent_id, code in [
        (question.pk, "invalid"),  # a user message
        (other_answer.pk, "not_found"),  # another conversation's answer
        (bobs_answer.pk, "not_found"),  # another user's
        ("nonsense", "not_found"),
    ]:
        await socket.send(type="send", content="Follow-up", parent_id=parent_id)
        error, _ = await socket.until("error")
        assert error["code"] == code, (parent_id, error)
    assert await state_of(mine, other, bobs) == before

    await socket.send(type="send", content="Follow-up", parent_id=answer.pk)
    kind, answer_id = await started_or_refused(socket)
    assert kind == "started"
    new = await Message.objects.select_related("parent").aget(pk=answer_id)
    assert new.parent.parent_id == answer.pk
    await socket.send(type="stop", message_id=answer_id)
    await socket.finished(answer_id)
    await socket.close()


async def test_a_database_error_becomes_an_error_event_and_the_socket_stays_open(alice, monkeypatch):
    from conversations.chat import tree

    mine, question, _ = await with_exchange(alice)
    socket = await opened(alice, mine)

    def broken(*args, **kwargs):
        raise OperationalError("the database went away")

    monkeypatch.setattr(tree, "switch_branch", broken)
    await socket.send(type="switch", message_id=question.pk)
    error, _ = await socket.until("error")
    assert error["code"] == "server_error" and "database" in error["detail"]
    await socket.send(type="ping")
    await socket.until("pong")
    await socket.close()
