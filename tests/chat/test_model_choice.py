"""Several models in the chat: the picker's choice kept per conversation and as the user's
default, each answer recording its model, "Regenerate with…" another model as a sibling
branch, and one question sent to two models side by side as sibling answers."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from conversations.models import Conversation, Message, ModelPreference
from conversations.ops.model_settings import ModelEntry
from tests.chat.conftest import Socket

pytestmark = pytest.mark.django_db(transaction=True)
SHORT = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture
def two_models(tiny_model_dir, tmp_path_factory):
    """Two served models in this process: "a" (the tiny model) and "b" (another random one)."""
    from conversations.ops.engine_handle import reset_engine_for_tests
    from tests.support.fakes import make_tiny_model_dir

    second = make_tiny_model_dir(tmp_path_factory.mktemp("chat-b") / "b", seed=9)
    original = settings.ENGINE_MODEL_LIST
    settings.ENGINE_MODEL_LIST = [
        ModelEntry("a", str(tiny_model_dir), 0.05, "The first"),
        ModelEntry("b", str(second), 0.05, "The second"),
    ]
    reset_engine_for_tests()
    yield
    reset_engine_for_tests()
    settings.ENGINE_MODEL_LIST = original


async def _open(user, conversation) -> Socket:
    socket = await Socket.open(user)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")
    return socket


async def test_the_picked_model_answers_and_is_remembered(two_models, make_user):
    user = await sync_to_async(make_user)("picker")
    conversation = await Conversation.objects.acreate(owner=user, **SHORT)
    socket = await _open(user, conversation)
    await socket.send(type="set_model", conversation_id=conversation.pk, model="b")
    thread, _ = await socket.until("thread")
    assert thread["conversation"]["model"] == "b"
    assert (await ModelPreference.objects.aget(user=user)).model == "b"
    await socket.send(type="send", conversation_id=conversation.pk, content="Hello")
    answer, _ = await socket.finished()
    first = await Message.objects.aget(pk=answer["id"])
    assert answer["status"] == "complete" and first.model_name == "b"
    # "Regenerate with…" model a: a sibling answer written by a.
    await socket.send(type="regenerate", conversation_id=conversation.pk, message_id=answer["id"], model="a")
    thread, _ = await socket.until("thread")
    again = thread["messages"][-1]
    done, _ = await socket.finished(again["id"])
    sibling = await Message.objects.aget(pk=again["id"])
    assert sibling.parent_id == first.parent_id and sibling.pk != first.pk
    assert done["status"] == "complete" and sibling.model_name == "a"
    # An unknown model is refused with a clear error, and nothing is added.
    await socket.send(
        type="regenerate", conversation_id=conversation.pk, message_id=answer["id"], model="zzz"
    )
    error, _ = await socket.until("error")
    assert "zzz" in error["detail"] and error["code"] == "unknown_model"
    await socket.close()


async def test_side_by_side_answers_stream_to_the_tab_together_until_one_is_kept(two_models, make_user):
    user = await sync_to_async(make_user)("sidebyside")
    conversation = await Conversation.objects.acreate(owner=user, **SHORT)
    socket = await _open(user, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Compare", models=["a", "b"])
    events: list[dict] = []
    finished: set[int] = set()
    while len(finished) < 2:  # both answers' events come to the tab, whichever is shown
        event = await socket.receive(timeout=60)
        events.append(event)
        if event["type"] == "finished":
            finished.add(event["message"]["id"])
    answers = [m async for m in Message.objects.filter(conversation=conversation, role="assistant")]
    assert [m.model_name for m in answers] == ["a", "b"] and finished == {m.pk for m in answers}
    assert answers[0].parent_id == answers[1].parent_id  # one question, two sibling answers
    first, second = (m.pk for m in answers)
    # The thread marks the question and carries the answer it does not go on through.
    question, shown = [e for e in events if e["type"] == "thread"][-1]["messages"][-2:]
    assert question["side_by_side"] == [first, second] and shown["id"] == first
    assert [(m["id"], m["model"]) for m in question["beside"]] == [(second, "b")]
    streamed = {e["message_id"] for e in events if e["type"] == "delta"}
    assert streamed == {first, second}
    # Keep the second: its branch is shown, as one answer again.
    await socket.send(type="keep", conversation_id=conversation.pk, message_id=second)
    thread, _ = await socket.until("thread")
    assert thread["messages"][-1]["id"] == second
    assert all("side_by_side" not in m for m in thread["messages"])
    # Going on follows the kept answer.
    await socket.send(type="send", conversation_id=conversation.pk, content="Go on")
    thread, _ = await socket.until("thread")
    assert (await Message.objects.aget(content="Go on")).parent_id == second
    await socket.finished(thread["messages"][-1]["id"])
    # An answer that is no side-by-side choice cannot be kept.
    await socket.send(type="keep", conversation_id=conversation.pk, message_id=first)
    error, _ = await socket.until("error")
    assert error["code"] == "invalid" and error["message_id"] == first
    await socket.close()


async def test_keeping_one_answer_while_they_stream_stops_the_others(two_models, make_user):
    user = await sync_to_async(make_user)("keepearly")
    conversation = await Conversation.objects.acreate(owner=user, temperature=0.0, max_tokens=4000)
    socket = await _open(user, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Compare", models=["a", "b"])
    while True:  # the thread that shows both answers, as soon as the second is created
        thread, _ = await socket.until("thread")
        question = thread["messages"][-2]
        if len(question.get("side_by_side", ())) == 2:
            break
    first, second = question["side_by_side"]
    await socket.send(type="keep", conversation_id=conversation.pk, message_id=first)
    statuses: dict[int, str] = {}
    while len(statuses) < 2:
        done, _ = await socket.until("finished")
        statuses[done["message"]["id"]] = done["message"]["status"]
        if first not in statuses:  # the kept one goes on: stopped here only to end the test
            await socket.send(type="stop", conversation_id=conversation.pk, message_id=first)
    assert statuses[second] == "interrupted"  # the user chose: the other is not written on
    conversation = await Conversation.objects.aget(pk=conversation.pk)
    assert conversation.current_leaf_id == first
    await socket.close()


async def test_a_conversation_is_retained_in_the_engine_of_its_latest_answer(two_models, make_user):
    from conversations.chat.retention import retention_key
    from conversations.ops.engine_handle import current_engine

    user = await sync_to_async(make_user)("retained")
    conversation = await Conversation.objects.acreate(owner=user, model="b", **SHORT)
    key = retention_key(conversation.pk)

    def marked(model: str) -> bool:
        engine = current_engine(model)
        return engine is not None and key in engine.engine.block_manager.retention.keys()

    socket = await _open(user, conversation)
    await socket.send(type="send", conversation_id=conversation.pk, content="Hello")
    answer, _ = await socket.finished()
    await _until(lambda: marked("b"))
    assert not marked("a")
    # Another model's answer: its engine holds the history now, and the mark moves there.
    await socket.send(type="regenerate", conversation_id=conversation.pk, message_id=answer["id"], model="a")
    thread, _ = await socket.until("thread")
    await socket.finished(thread["messages"][-1]["id"])
    await _until(lambda: marked("a") and not marked("b"))
    await socket.close()
    await _until(lambda: not marked("a") and not marked("b"))


async def _until(condition, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the conversation's mark did not reach the expected engine")
