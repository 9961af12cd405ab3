"""Prepared queries: the ORM's SQL built once; the same rows as the queryset's, the same
writes as its ``update`` and as ``create``, on every call."""

from __future__ import annotations

import pytest
from django.db.models import signals
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.prepared_queries import PreparedInsert, PreparedRead, PreparedUpdate

pytestmark = pytest.mark.django_db

messages_of = PreparedRead(
    lambda conversation_id: (
        Message.objects.filter(conversation_id=conversation_id)
        .defer("token_ids")
        .order_by("created_at", "id")
    )
)
owned = PreparedRead(
    lambda pk, owner_id: Conversation.objects.filter(pk=pk, owner_id=owner_id).order_by()[:1]
)
streaming_of_user = PreparedRead(
    lambda owner_id, status: (
        Message.objects.filter(status=status, conversation__owner_id=owner_id)
        .order_by("id")
        .values_list("conversation_id", "owner_process", "updated_at")
    )
)
ids_of = PreparedRead(
    lambda conversation_id: (
        Message.objects.filter(conversation_id=conversation_id).order_by("id").values_list("id", flat=True)
    )
)

streaming_row = PreparedUpdate(
    lambda pk, owner: Message.objects.filter(pk=pk, owner_process=owner, status=Message.Status.STREAMING)
)

insert_message = PreparedInsert(Message)


def fields_of(message: Message) -> dict:
    return {name: value for name, value in vars(message).items() if not name.startswith("_")}


@pytest.fixture
def two_users_messages(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    chats = {}
    for user in (alice, bob):
        conversation = Conversation.objects.create(owner=user, title=f"{user.username}'s")
        question = Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content="Hi", token_ids=[1, 2, 3]
        )
        Message.objects.create(
            conversation=conversation,
            parent=question,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            owner_process=f"process-{user.username}",
            tool_calls=[{"name": "search", "arguments": {"q": "é"}}],
            reasoning_seconds=1.5,
        )
        chats[user.username] = (user, conversation)
    return chats


def test_model_rows_equal_the_querysets_field_for_field(two_users_messages):
    for _, conversation in two_users_messages.values():
        expected = list(
            Message.objects.filter(conversation_id=conversation.pk)
            .defer("token_ids")
            .order_by("created_at", "id")
        )
        got = messages_of(conversation.pk)
        assert [fields_of(m) for m in got] == [fields_of(m) for m in expected]
        assert all(m.get_deferred_fields() == {"token_ids"} for m in got)
        assert timezone.is_aware(got[0].created_at)
        assert got[1].tool_calls == [{"name": "search", "arguments": {"q": "é"}}]
        assert got[0].token_ids == [1, 2, 3]  # a deferred field still loads on access


def test_each_call_takes_its_own_values_and_the_managers_filter_stays(two_users_messages):
    alice, alices = two_users_messages["alice"]
    bob, bobs = two_users_messages["bob"]
    assert [c.pk for c in owned(alices.pk, alice.pk)] == [alices.pk]
    assert [c.pk for c in owned(bobs.pk, bob.pk)] == [bobs.pk]
    assert owned(bobs.pk, alice.pk) == []  # another user's conversation is not found
    Conversation.objects.filter(pk=alices.pk).update(deleted_at=timezone.now())
    assert owned(alices.pk, alice.pk) == []  # ``Conversation.objects`` leaves deleted ones out


def test_values_list_rows_through_a_join_equal_the_querysets(two_users_messages):
    for user, _ in two_users_messages.values():
        expected = list(
            Message.objects.filter(status="streaming", conversation__owner_id=user.pk)
            .order_by("id")
            .values_list("conversation_id", "owner_process", "updated_at")
        )
        assert streaming_of_user(user.pk, "streaming") == expected
        assert len(expected) == 1 and timezone.is_aware(expected[0][2])
    alice = two_users_messages["alice"][0]
    questions = streaming_of_user(alice.pk, "complete")
    assert [(row[0], row[1]) for row in questions] == [(two_users_messages["alice"][1].pk, "")]
    assert streaming_of_user(alice.pk, "error") == []


def test_flat_values_and_one_query_per_call(two_users_messages, django_assert_num_queries):
    _, conversation = two_users_messages["alice"]
    expected = list(
        Message.objects.filter(conversation_id=conversation.pk).order_by("id").values_list("id", flat=True)
    )
    ids_of(conversation.pk)  # built here, outside the count
    with django_assert_num_queries(1):
        assert ids_of(conversation.pk) == expected


def test_values_are_coerced_as_the_first_call_had_them(two_users_messages):
    alice, conversation = two_users_messages["alice"]
    owned(conversation.pk, alice.pk)
    assert [c.pk for c in owned(str(conversation.pk), str(alice.pk))] == [conversation.pk]
    with pytest.raises(ValueError):
        owned("not a number", alice.pk)
    with pytest.raises(TypeError):
        PreparedRead(lambda flag: Conversation.objects.filter(pinned=flag))(True)


def test_reads_it_cannot_keep_are_refused_when_built(two_users_messages):
    alice, conversation = two_users_messages["alice"]
    unused = PreparedRead(lambda pk, other: Conversation.objects.filter(pk=pk))
    with pytest.raises(ValueError, match="lookup"):
        unused(conversation.pk, 5)
    related = PreparedRead(
        lambda pk: Message.objects.filter(conversation_id=pk).select_related("conversation")
    )
    with pytest.raises(ValueError, match="plain model rows"):
        related(conversation.pk)
    as_dicts = PreparedRead(lambda pk: Message.objects.filter(conversation_id=pk).values("id"))
    with pytest.raises(ValueError, match="cannot yield"):
        as_dicts(conversation.pk)


def test_an_update_writes_what_the_querysets_update_writes_and_counts_the_rows(two_users_messages):
    _, conversation = two_users_messages["alice"]
    answer = Message.objects.get(conversation=conversation, role=Message.Role.ASSISTANT)
    twin = Message.objects.get(conversation=two_users_messages["bob"][1], role=Message.Role.ASSISTANT)
    now = timezone.now()
    values = {
        "content": "Hello é",
        "token_ids": [5, 6],
        "tool_calls": None,
        "reasoning_seconds": None,
        "prompt_tokens": 7,
        "updated_at": now,
    }
    assert streaming_row(answer.pk, "process-alice", **values) == 1
    assert streaming_row(twin.pk, "process-alice", **values) == 0  # bob's: another owner
    Message.objects.filter(pk=twin.pk).update(**values)  # the ORM's own write, to compare
    answer.refresh_from_db()
    twin.refresh_from_db()
    for name, value in values.items():
        assert getattr(answer, name) == getattr(twin, name) == value
    assert answer.tool_calls is None  # SQL NULL, as the ORM's ``update`` stores None


def test_an_update_keeps_one_statement_per_set_of_columns(two_users_messages, django_assert_num_queries):
    _, conversation = two_users_messages["alice"]
    answer = Message.objects.get(conversation=conversation, role=Message.Role.ASSISTANT)
    streaming_row(answer.pk, "process-alice", content="a")
    streaming_row(answer.pk, "process-alice", status="complete", content="ab")
    with django_assert_num_queries(2):
        assert streaming_row(answer.pk, "process-alice", content="abc") == 0  # complete now
        assert streaming_row(answer.pk, "process-alice", content="abc", status="complete") == 0
    answer.refresh_from_db()
    assert (answer.content, answer.status) == ("ab", "complete")


def test_an_update_refuses_a_column_that_is_not_its_tables(two_users_messages):
    _, conversation = two_users_messages["alice"]
    with pytest.raises(Exception, match="no_such_column"):
        streaming_row(conversation.pk, "x", no_such_column=1)


def test_an_insert_stores_and_returns_what_create_does(two_users_messages):
    alice, conversation = two_users_messages["alice"]
    question = Message.objects.filter(conversation=conversation, role=Message.Role.USER).get()
    values = {
        "conversation": conversation,
        "parent": question,
        "role": Message.Role.ASSISTANT,
        "content": "é",
        "status": Message.Status.STREAMING,
        "owner_process": "p",
        "tool_calls": [{"name": "x"}],
    }
    made = insert_message(**values)
    twin = Message.objects.create(**values)
    assert made.pk is not None and made.pk != twin.pk
    assert not made._state.adding and made._state.db == "default"
    assert made.created_at is not None and made.updated_at is not None
    stored, stored_twin = Message.objects.get(pk=made.pk), Message.objects.get(pk=twin.pk)
    ignored = {"id", "created_at", "updated_at"}
    assert {k: v for k, v in fields_of(stored).items() if k not in ignored} == {
        k: v for k, v in fields_of(stored_twin).items() if k not in ignored
    }
    assert stored.created_at == made.created_at and stored.tool_calls == [{"name": "x"}]
    assert insert_message(conversation=conversation, role=Message.Role.USER, content="again").pk > twin.pk


def test_an_insert_sends_the_save_signals_and_checks_related_rows(two_users_messages):
    _, conversation = two_users_messages["alice"]
    seen: list[tuple[str, bool]] = []

    def before(sender, instance, **kwargs):
        seen.append(("pre", instance.pk is None))

    def after(sender, instance, created, **kwargs):
        seen.append(("post", created and instance.pk is not None))

    signals.pre_save.connect(before, sender=Message)
    signals.post_save.connect(after, sender=Message)
    try:
        insert_message(conversation=conversation, role=Message.Role.USER, content="hi")
    finally:
        signals.pre_save.disconnect(before, sender=Message)
        signals.post_save.disconnect(after, sender=Message)
    assert seen == [("pre", True), ("post", True)]
    unsaved = Message(conversation=conversation, role=Message.Role.USER)
    with pytest.raises(ValueError, match="unsaved"):
        insert_message(conversation=conversation, parent=unsaved, role=Message.Role.ASSISTANT)
