"""Admin: conversations with their message tree, searchable; a read-only engine status page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from conversations.chat import tree as tree_ops

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    admin = get_user_model().objects.create_superuser(
        "root", "root@example.com", "a-long-unusual-passphrase-42"
    )
    client.force_login(admin)
    return client


def test_conversation_admin_shows_the_message_tree_and_searches_content(
    admin_client, make_user, make_conversation
):
    conversation = make_conversation(make_user("alice"), title="Trip")
    _, answer = tree_ops.send_message(conversation, "Where to go in Porto?")
    tree_ops.regenerate(conversation, answer.pk)
    page = admin_client.get(f"/admin/conversations/conversation/{conversation.pk}/change/").content.decode()
    assert "message tree" in page.lower() and "Where to go in Porto?" in page
    assert page.count("[streaming]") == 2  # both answers, under the one question
    found = admin_client.get("/admin/conversations/conversation/?q=porto").content.decode()
    assert "Trip" in found
    assert admin_client.get("/admin/conversations/message/?q=porto").status_code == 200
    assert admin_client.get("/admin/auth/user/").status_code == 200


def test_engine_status_page_is_read_only_and_does_not_load_the_model(admin_client):
    from conversations.ops import engine_handle as engine

    page = admin_client.get("/admin/conversations/enginestatus/")
    assert page.status_code == 200
    body = page.content.decode()
    for label in (
        "Running requests",
        "Waiting requests",
        "KV blocks used",
        "KV blocks cached",
        "KV blocks free",
    ):
        assert label in body
    assert "Prefix cache hit rate" in body and "Tokens per second" in body
    assert admin_client.get("/admin/conversations/enginestatus/add/").status_code == 403
    slot = engine.slot_for(None)
    assert slot.engine is None or slot.state == "ready"


def test_engine_status_page_needs_staff(client, make_user):
    client.force_login(make_user("alice"))
    assert client.get("/admin/conversations/enginestatus/").status_code == 302


@pytest.mark.usefixtures("tiny_engine")
def test_engine_status_page_shows_the_loaded_engines_numbers(admin_client):
    from conversations.ops.engine_handle import get_engine

    engine = get_engine()
    stats = engine.stats()
    body = admin_client.get("/admin/conversations/enginestatus/").content.decode()
    assert engine.model_name in body and "ready" in body
    assert f"<td>{stats.kv_blocks_total}</td>" in body


def deep_thread(conversation, depth: int) -> list[int]:
    """A user/assistant thread ``depth`` messages deep, inserted in one statement."""
    from conversations.models import Message

    base = (Message.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
    messages = [
        Message(
            pk=base + i,
            conversation=conversation,
            parent_id=base + i - 1 if i else None,
            role="user" if i % 2 == 0 else "assistant",
            content=f"message {i}",
        )
        for i in range(depth)
    ]
    Message.objects.bulk_create(messages, batch_size=500)
    return [m.pk for m in messages]


def test_the_tree_view_renders_a_thread_5000_messages_deep(admin_client, make_user, make_conversation):
    conversation = make_conversation(make_user("alice"), title="Deep")
    ids = deep_thread(conversation, 5000)
    response = admin_client.get(f"/admin/conversations/conversation/{conversation.pk}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert f"#{ids[-1]}</a>" in page and "message 4999" in page
    assert page.count("<ul>") >= 5000  # one nested list per level
    listing = admin_client.get(f"/admin/conversations/message/?conversation__id__exact={conversation.pk}")
    assert listing.status_code == 200 and "5000 messages" in listing.content.decode()


def test_changing_a_messages_parent_in_the_admin_cannot_create_a_cycle(
    admin_client, make_user, make_conversation
):
    from conversations.models import Message

    conversation = make_conversation(make_user("alice"), title="Loop")
    first, second, third = deep_thread(conversation, 3)
    url = f"/admin/conversations/message/{first}/change/"
    form = {"conversation": conversation.pk, "role": "user", "content": "message 0", "status": "complete"}
    form.update(prompt_tokens=0, completion_tokens=0, cached_tokens=0, context_dropped=0)
    for parent in (third, first):  # a descendant, then the message itself
        response = admin_client.post(url, {**form, "parent": parent})
        assert response.status_code == 200  # the form again, with the error
        assert "cycle" in response.content.decode()
        assert Message.objects.get(pk=first).parent_id is None
    # A legitimate move still works: the third message re-attached under the first.
    response = admin_client.post(
        f"/admin/conversations/message/{third}/change/",
        {**form, "role": "user", "content": "message 2", "parent": first},
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Message.objects.get(pk=third).parent_id == first


def test_a_parent_from_another_conversation_is_refused_in_the_admin(
    admin_client, make_user, make_conversation
):
    from conversations.models import Message

    alice = make_user("alice")
    here, there = make_conversation(alice, title="Here"), make_conversation(alice, title="There")
    (mine,) = deep_thread(here, 1)
    (foreign,) = deep_thread(there, 1)
    response = admin_client.post(
        f"/admin/conversations/message/{mine}/change/",
        {
            "conversation": here.pk,
            "role": "user",
            "content": "message 0",
            "status": "complete",
            "parent": foreign,
        },
    )
    assert response.status_code == 200 and "same conversation" in response.content.decode()
    assert Message.objects.get(pk=mine).parent_id is None
