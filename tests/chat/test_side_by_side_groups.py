"""Side-by-side groups in the message tree: which answers a question's columns hold, what the
thread carries for them (every answer of the group, within one frame), keeping one, and going
on from the first without choosing."""

from __future__ import annotations

import orjson
import pytest

from conversations.chat import tree as tree_ops
from conversations.chat.thread_dicts import every_message
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(make_user, make_conversation):
    return make_conversation(make_user("alice"))


def side_by_side(conversation: Conversation, text: str = "Both of you?", models=("a", "b")) -> list[Message]:
    """What ``service.send_side_by_side`` asks of the tree: the question with the first model's
    answer, then one answer beside it per other model."""
    _, first = tree_ops.send_message(conversation, text, model=models[0], side_by_side=True)
    group = [first]
    for model in models[1:]:
        group.append(tree_ops.regenerate(conversation, first.parent_id, model=model, beside_live=True)[1])
    return group


def finish(message: Message, text: str) -> None:
    Message.objects.filter(pk=message.pk).update(content=text, status=Message.Status.COMPLETE)


def thread(conversation: Conversation) -> list[dict]:
    conversation.refresh_from_db()
    return tree_ops.thread_dict(tree_ops.Tree.load(conversation), paged=True)["messages"]


def test_a_side_by_side_send_shows_the_question_with_every_answer_of_its_group(conversation):
    first, second, third = side_by_side(conversation, models=("a", "b", "c"))
    finish(second, "B's answer")
    messages = thread(conversation)
    question, shown = messages
    # The thread goes on through the first answer (a question sent next follows it) ...
    assert shown["id"] == first.pk and shown["model"] == "a"
    # ... and the question names the group in column order, with the other answers' dicts.
    assert question["side_by_side"] == [first.pk, second.pk, third.pk]
    beside = {m["id"]: m for m in question["beside"]}
    assert list(beside) == [second.pk, third.pk]
    assert (beside[second.pk]["model"], beside[second.pk]["content"], beside[second.pk]["status"]) == (
        "b",
        "B's answer",
        "complete",
    )
    assert beside[third.pk]["status"] == "streaming" and beside[third.pk]["model"] == "c"
    assert [m["id"] for m in every_message(messages)] == [question["id"], second.pk, third.pk, first.pk]
    # The HTTP view's whole thread says the same.
    whole = tree_ops.thread_dict(tree_ops.Tree.load(conversation))["messages"]
    assert whole[0]["side_by_side"] == question["side_by_side"]


def test_answers_added_later_and_lone_answers_are_no_group(conversation):
    first, second = side_by_side(conversation)
    finish(first, "A")
    finish(second, "B")
    # "Regenerate" adds a sibling outside the group and shows it: no columns then.
    _, third = tree_ops.regenerate(conversation, first.pk, model="a")
    tree = tree_ops.Tree.load(conversation)
    assert tree.side_by_side(tree.by_id[first.parent_id]) == [first, second]
    assert "side_by_side" not in thread(conversation)[0]
    # An ordinary question, and a group with one answer left, have none.
    tree_ops.delete_subtree(conversation, second.pk)
    tree = tree_ops.Tree.load(conversation)
    assert tree.side_by_side(tree.by_id[first.parent_id]) == []
    _, plain = tree_ops.send_message(conversation, "Plain", parent_id=third.pk)
    tree = tree_ops.Tree.load(conversation)
    assert tree.side_by_side(tree.by_id[plain.parent_id]) == []


def test_keeping_one_shows_its_branch_and_stops_the_others(conversation):
    first, second, third = side_by_side(conversation, models=("a", "b", "c"))
    finish(third, "C")
    _, streaming = tree_ops.keep_answer(conversation, second.pk)
    assert streaming == [first.pk]  # the third has finished: nothing to stop there
    conversation.refresh_from_db()
    assert conversation.current_leaf_id == second.pk
    messages = thread(conversation)
    assert [m["id"] for m in messages][-1] == second.pk
    assert "side_by_side" not in messages[0] and "beside" not in messages[0]
    # The others stay sibling branches, reachable by the branch switcher.
    assert messages[-1]["siblings"] == [first.pk, second.pk, third.pk]
    # Kept once: nothing is waiting for a choice any more.
    with pytest.raises(tree_ops.TreeError):
        tree_ops.keep_answer(conversation, first.pk)


def test_only_an_answer_of_an_open_group_can_be_kept(conversation):
    _, plain = tree_ops.send_message(conversation, "Hello")
    finish(plain, "Hi")
    with pytest.raises(tree_ops.TreeError):
        tree_ops.keep_answer(conversation, plain.pk)
    with pytest.raises(tree_ops.TreeError):
        tree_ops.keep_answer(conversation, plain.parent_id)


def test_going_on_without_choosing_continues_from_the_first_answer(conversation):
    first, second = side_by_side(conversation)
    finish(first, "A")
    finish(second, "B")
    conversation.refresh_from_db()
    _, next_answer = tree_ops.send_message(conversation, "Go on")  # under the current leaf
    assert next_answer.parent.parent_id == first.pk
    messages = thread(conversation)
    assert all("side_by_side" not in m for m in messages)
    assert [m["id"] for m in messages][:2] == [first.parent_id, first.pk]


def test_a_group_and_its_question_fit_one_frame_whatever_their_texts(conversation, settings):
    settings.WEBSOCKET_MAX_MESSAGE_BYTES = 64 * 1024
    before = tree_ops.send_message(conversation, "Earlier")[1]
    finish(before, "x" * 10_000)
    first, second, third = side_by_side(conversation, text="q" * 30_000, models=("a", "b", "c"))
    for message in (first, second, third):
        finish(message, "é" * 40_000)  # 80 KB each: over the frame alone
    Message.objects.filter(pk=first.pk).update(reasoning="r" * 40_000)
    messages = thread(conversation)
    question, shown = messages[-2:]
    # The shown answer fills half the page's budget, the question with its group the rest and
    # more: it comes with its group all the same; the older answer does not.
    assert question["side_by_side"] == [first.pk, second.pk, third.pk] and len(messages) == 2
    assert len(orjson.dumps(messages)) > 64 * 1024 // 3
    assert shown["truncated"] == ["content", "reasoning"]
    for beside in question["beside"]:
        assert beside["truncated"] == ["content"] and len(beside["content"].encode()) <= 64 * 1024 // 32
    frame = orjson.dumps({"type": "thread", "messages": messages})
    assert len(frame) < 64 * 1024
