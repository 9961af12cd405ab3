"""The message tree on the models: thread, siblings, branches, delete, bounded queries."""

from __future__ import annotations

import pytest

from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def answer(tree_result, text: str = "an answer") -> Message:
    """Complete the streaming answer an operation created."""
    _, message = tree_result
    Message.objects.filter(pk=message.pk).update(content=text, status=Message.Status.COMPLETE)
    message.refresh_from_db()
    return message


def thread_of(conversation: Conversation) -> list[tuple[str, str]]:
    conversation.refresh_from_db()
    return [(m.role, m.content) for m in tree_ops.Tree.load(conversation).thread()]


@pytest.fixture
def conversation(make_user, make_conversation):
    return make_conversation(make_user("alice"))


def test_send_adds_the_question_and_a_streaming_answer_under_the_current_leaf(conversation):
    first = answer(tree_ops.send_message(conversation, "Hello"), "Hi!")
    _, second = tree_ops.send_message(conversation, "How are you?")
    conversation.refresh_from_db()
    assert conversation.current_leaf_id == second.pk
    assert second.status == Message.Status.STREAMING
    assert second.parent.parent_id == first.pk
    assert thread_of(conversation) == [
        ("user", "Hello"),
        ("assistant", "Hi!"),
        ("user", "How are you?"),
        ("assistant", ""),
    ]


def test_first_message_titles_the_conversation(conversation):
    tree_ops.send_message(conversation, "# Plan a *trip* to Lisbon\nwith kids, in May")
    conversation.refresh_from_db()
    assert conversation.title == "Plan a trip to Lisbon"


def test_long_titles_are_cut_at_a_word():
    title = tree_ops.make_title("word " * 40)
    assert len(title) <= tree_ops.TITLE_LENGTH + 1 and title.endswith("…") and "wor…" not in title


def test_empty_message_is_refused(conversation):
    with pytest.raises(tree_ops.TreeError):
        tree_ops.send_message(conversation, "   ")


def test_edit_creates_a_sibling_question_with_a_fresh_answer_and_keeps_the_old_branch(conversation):
    answer(tree_ops.send_message(conversation, "Hello"), "Hi!")
    user = Message.objects.get(role="user")
    tree, new_answer = tree_ops.edit_message(conversation, user.pk, "Hello again")
    thread = tree.thread()
    assert [m.content for m in thread] == ["Hello again", ""]
    assert [m.content for m in tree.siblings(thread[0])] == ["Hello", "Hello again"]
    assert Message.objects.count() == 4  # both branches are kept
    assert new_answer.parent_id == thread[0].pk


def test_edit_refuses_an_answer(conversation):
    message = answer(tree_ops.send_message(conversation, "Hello"))
    with pytest.raises(tree_ops.TreeError):
        tree_ops.edit_message(conversation, message.pk, "no")


def test_regenerate_creates_a_sibling_answer(conversation):
    first = answer(tree_ops.send_message(conversation, "Hello"), "one")
    tree, second = tree_ops.regenerate(conversation, first.pk)
    assert second.parent_id == first.parent_id
    assert [m.pk for m in tree.siblings(second)] == [first.pk, second.pk]
    assert tree.thread()[-1].pk == second.pk


def test_regenerate_on_an_unanswered_question_answers_it(conversation):
    message = answer(tree_ops.send_message(conversation, "Hello"))
    tree, _ = tree_ops.delete_subtree(conversation, message.pk)
    question = tree.thread()[-1]
    tree, new = tree_ops.regenerate(conversation, question.pk)
    assert new.parent_id == question.pk and tree.thread()[-1].pk == new.pk


def test_switching_branch_returns_to_the_leaf_last_selected_in_it(conversation):
    answer(tree_ops.send_message(conversation, "Q1"), "A1")
    answer(tree_ops.send_message(conversation, "Q2"), "A2")
    deep_leaf = conversation.current_leaf_id
    q1 = Message.objects.get(content="Q1")
    answer(tree_ops.edit_message(conversation, q1.pk, "Q1 edited"), "A1 edited")
    assert [c for _, c in thread_of(conversation)] == ["Q1 edited", "A1 edited"]

    tree = tree_ops.switch_branch(conversation, q1.pk)
    assert tree.thread()[-1].pk == deep_leaf
    assert [c for _, c in thread_of(conversation)] == ["Q1", "A1", "Q2", "A2"]

    edited = Message.objects.get(content="Q1 edited")
    tree_ops.switch_branch(conversation, edited.pk)
    assert [c for _, c in thread_of(conversation)] == ["Q1 edited", "A1 edited"]


def test_an_only_child_needs_no_pointer_and_a_second_child_sets_one(conversation):
    first = answer(tree_ops.send_message(conversation, "Hello"), "one")
    question = Message.objects.get(pk=first.parent_id)
    assert question.active_child_id is None  # its only answer: no update was written
    _, second = tree_ops.regenerate(conversation, first.pk)
    question.refresh_from_db()
    assert question.active_child_id == second.pk
    tree = tree_ops.switch_branch(conversation, first.pk)
    question.refresh_from_db()
    assert question.active_child_id == first.pk and tree.thread()[-1].pk == first.pk
    tree_ops.delete_subtree(conversation, first.pk)
    assert [c for _, c in thread_of(conversation)] == ["Hello", ""]  # the other answer, still streaming


def test_switching_between_answers_keeps_each_answers_follow_up(conversation):
    a1 = answer(tree_ops.send_message(conversation, "Q1"), "A1")
    answer(tree_ops.send_message(conversation, "Q2 after A1"), "A2")
    a1b = answer(tree_ops.regenerate(conversation, a1.pk), "A1b")
    assert [c for _, c in thread_of(conversation)] == ["Q1", "A1b"]
    tree_ops.switch_branch(conversation, a1.pk)
    assert [c for _, c in thread_of(conversation)] == ["Q1", "A1", "Q2 after A1", "A2"]
    tree_ops.switch_branch(conversation, a1b.pk)
    assert [c for _, c in thread_of(conversation)] == ["Q1", "A1b"]


def test_delete_removes_the_subtree_and_shows_a_sibling(conversation):
    a1 = answer(tree_ops.send_message(conversation, "Q1"), "A1")
    answer(tree_ops.send_message(conversation, "Q2"), "A2")
    a1b = answer(tree_ops.regenerate(conversation, a1.pk), "A1b")
    tree_ops.switch_branch(conversation, a1.pk)
    _, deleted = tree_ops.delete_subtree(conversation, a1.pk)
    assert len(deleted) == 3  # A1, Q2, A2
    assert set(Message.objects.values_list("content", flat=True)) == {"Q1", "A1b"}
    assert thread_of(conversation) == [("user", "Q1"), ("assistant", "A1b")]
    assert conversation.current_leaf_id == a1b.pk


def test_delete_of_the_only_branch_leaves_the_parent_as_leaf(conversation):
    message = answer(tree_ops.send_message(conversation, "Q1"), "A1")
    tree_ops.delete_subtree(conversation, message.pk)
    assert thread_of(conversation) == [("user", "Q1")]
    root = Message.objects.get()
    tree_ops.delete_subtree(conversation, root.pk)
    assert thread_of(conversation) == []
    assert conversation.current_leaf_id is None and conversation.active_root_id is None


def test_delete_of_a_root_shows_the_other_root(conversation):
    answer(tree_ops.send_message(conversation, "Q1"), "A1")
    q1 = Message.objects.get(content="Q1")
    answer(tree_ops.edit_message(conversation, q1.pk, "Q1b"), "A1b")
    tree_ops.delete_subtree(conversation, Message.objects.get(content="Q1b").pk)
    assert thread_of(conversation) == [("user", "Q1"), ("assistant", "A1")]


def test_messages_of_another_conversation_are_unknown(conversation, make_conversation):
    other = make_conversation(conversation.owner)
    message = answer(tree_ops.send_message(other, "elsewhere"))
    with pytest.raises(tree_ops.TreeError):
        tree_ops.switch_branch(conversation, message.pk)
    with pytest.raises(tree_ops.TreeError):
        tree_ops.delete_subtree(conversation, message.pk)


def build_long_conversation(conversation: Conversation, pairs: int) -> None:
    parent = None
    for i in range(pairs):
        user = Message.objects.create(conversation=conversation, parent=parent, role="user", content=f"q{i}")
        parent = Message.objects.create(
            conversation=conversation,
            parent=user,
            role="assistant",
            content=f"a{i}",
            token_ids=list(range(50)),
        )
        if i % 10 == 0:  # some branches along the way
            Message.objects.create(
                conversation=conversation, parent=user, role="assistant", content=f"alt{i}"
            )
    tree_ops.select_leaf(tree_ops.Tree.load(conversation), parent)


def test_a_200_message_conversation_loads_in_a_bounded_number_of_queries(
    conversation, django_assert_max_num_queries
):
    build_long_conversation(conversation, 100)
    conversation = Conversation.objects.get(pk=conversation.pk)
    with django_assert_max_num_queries(2):
        tree = tree_ops.Tree.load(conversation)
        data = tree_ops.thread_dict(tree)
    assert len(data["messages"]) == 200
    assert data["messages"][-1]["content"] == "a99"
    assert data["messages"][1]["siblings"] and len(data["messages"][1]["siblings"]) == 2


def test_operations_on_a_200_message_conversation_take_bounded_queries(
    conversation, django_assert_max_num_queries
):
    build_long_conversation(conversation, 100)
    conversation = Conversation.objects.get(pk=conversation.pk)
    with django_assert_max_num_queries(12):
        tree_ops.send_message(conversation, "one more")
    with django_assert_max_num_queries(12):
        tree_ops.switch_branch(conversation, Message.objects.get(content="alt0").pk)
    first_answer = Message.objects.get(content="a0")
    with django_assert_max_num_queries(20):
        _, deleted = tree_ops.delete_subtree(conversation, first_answer.pk)
    assert len(deleted) == 1 + 99 * 2 + 9 + 2  # a0, the pairs below it, 9 alternatives, "one more"


def test_the_live_answer_limits_count_only_answers_that_are_still_live(
    make_user, make_conversation, settings
):
    from datetime import timedelta

    from django.utils import timezone

    settings.MAX_LIVE_PER_USER = 2
    user = make_user("bob")
    here, *others = [make_conversation(user) for _ in range(4)]
    stale = timezone.now() - timedelta(seconds=tree_ops.LEGACY_STALE_SECONDS + 5)
    live = {"alive"}

    def streaming(conversation, owner: str, touched=None) -> Message:
        message = Message.objects.create(
            conversation=conversation, role="assistant", status=Message.Status.STREAMING, owner_process=owner
        )
        if touched is not None:
            Message.objects.filter(pk=message.pk).update(updated_at=touched)
        return message

    # A dead process's answer and an ownerless stale one count for nothing.
    streaming(others[0], "dead")
    streaming(others[1], "", touched=stale)
    tree_ops.lock_for_answer(here, live)
    # A live process's answer elsewhere counts towards the user's limit; so does a recent
    # ownerless one: two of two.
    streaming(others[2], "alive")
    tree_ops.lock_for_answer(here, live)
    streaming(others[1], "")
    with pytest.raises(tree_ops.Busy, match="too many answers"):
        tree_ops.lock_for_answer(here, live)
    # One live answer in this conversation is refused as such, whatever the limit.
    settings.MAX_LIVE_PER_USER = 10
    streaming(here, "alive")
    with pytest.raises(tree_ops.Busy, match="still being written"):
        tree_ops.lock_for_answer(here, live)
    # Another user's live answers are not this user's.
    carol = make_user("carol")
    assert tree_ops.lock_for_answer(make_conversation(carol), live)
