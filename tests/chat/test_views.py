"""Pages and JSON endpoints: login required, another user's ids are 404, list, search,
rename, settings, delete."""

from __future__ import annotations

import json

import pytest

from conversations.chat import tree as tree_ops
from conversations.chat.housekeeping import purge_deleted_conversations
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


def post_json(client, url, data=None):
    return client.post(url, json.dumps(data or {}), content_type="application/json")


def test_every_endpoint_requires_login(client, alice, make_conversation):
    conversation = make_conversation(alice)
    assert client.get(f"/c/{conversation.pk}/").status_code == 302
    assert client.get("/chat/conversations/").status_code == 401
    assert client.get(f"/chat/conversations/{conversation.pk}/").status_code == 401
    assert post_json(client, "/chat/conversations/new/").status_code == 401
    assert (
        post_json(client, f"/chat/conversations/{conversation.pk}/update/", {"title": "x"}).status_code == 401
    )
    assert post_json(client, f"/chat/conversations/{conversation.pk}/delete/").status_code == 401
    assert Conversation.objects.filter(pk=conversation.pk, title="New chat").exists()


def test_another_users_conversation_is_a_404_everywhere(client, alice, bob, make_conversation):
    conversation = make_conversation(alice, title="Alice's secret")
    tree_ops.send_message(conversation, "private words")
    client.force_login(bob)
    assert client.get(f"/c/{conversation.pk}/").status_code == 404
    assert client.get(f"/chat/conversations/{conversation.pk}/").status_code == 404
    assert (
        post_json(client, f"/chat/conversations/{conversation.pk}/update/", {"title": "mine"}).status_code
        == 404
    )
    assert post_json(client, f"/chat/conversations/{conversation.pk}/delete/").status_code == 404
    assert client.get("/chat/conversations/?q=private").json()["conversations"] == []
    assert "Alice" not in client.get("/").content.decode()
    conversation.refresh_from_db()
    assert conversation.title == "Alice's secret"


def test_the_chat_page_embeds_the_users_conversations_newest_first(client, alice, make_conversation):
    older = make_conversation(alice, title="Older")
    newer = make_conversation(alice, title="Newer")
    client.force_login(alice)
    response = client.get(f"/c/{older.pk}/")
    assert response.status_code == 200
    state = json.loads(
        response.content.decode().split('id="chat-state" type="application/json">')[1].split("</script>")[0]
    )
    assert state["conversation_id"] == older.pk
    assert [c["id"] for c in state["conversations"]] == [newer.pk, older.pk]
    body = response.content.decode()
    for vendored in ("marked-18.2.1/marked.umd.js", "dompurify-3.5.0/purify.min.js", "highlight.js-11.12.0"):
        assert vendored in body


def test_search_finds_titles_and_message_content(client, alice, make_conversation):
    by_title = make_conversation(alice, title="Lisbon trip")
    by_content = make_conversation(alice, title="Something else")
    tree_ops.send_message(by_content, "What to eat in lisbon? Pastéis de nata")
    make_conversation(alice, title="Unrelated")
    client.force_login(alice)
    found = client.get("/chat/conversations/?q=LISBON").json()["conversations"]
    assert {c["id"] for c in found} == {by_title.pk, by_content.pk}
    snippet = next(c["snippet"] for c in found if c["id"] == by_content.pk)
    assert "lisbon" in snippet.lower()
    assert len(client.get("/chat/conversations/").json()["conversations"]) == 3


def test_new_chat_reuses_an_untouched_empty_conversation(client, alice):
    client.force_login(alice)
    first = post_json(client, "/chat/conversations/new/").json()["conversation"]["id"]
    again = post_json(client, "/chat/conversations/new/").json()["conversation"]["id"]
    assert first == again
    tree_ops.send_message(Conversation.objects.get(pk=first), "hi")
    third = post_json(client, "/chat/conversations/new/").json()["conversation"]["id"]
    assert third != first


def test_rename_and_settings(client, alice, make_conversation):
    conversation = make_conversation(alice)
    client.force_login(alice)
    url = f"/chat/conversations/{conversation.pk}/update/"
    response = post_json(client, url, {"title": "  Renamed  "})
    assert response.status_code == 200 and response.json()["conversation"]["title"] == "Renamed"
    settings = {
        "system_prompt": "Be brief.",
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "max_tokens": 100,
    }
    assert post_json(client, url, settings).status_code == 200
    conversation.refresh_from_db()
    assert conversation.title == "Renamed"
    assert (conversation.system_prompt, conversation.temperature, conversation.top_p) == (
        "Be brief.",
        0.2,
        0.9,
    )
    assert (conversation.top_k, conversation.max_tokens) == (40, 100)


@pytest.mark.parametrize(
    "field,value",
    [
        ("title", ""),
        ("temperature", 3),
        ("top_p", 0),
        ("top_k", -1),
        ("max_tokens", 0),
        ("max_tokens", "lots"),
    ],
)
def test_invalid_settings_are_refused_with_the_fields_name(client, alice, make_conversation, field, value):
    conversation = make_conversation(alice)
    client.force_login(alice)
    response = post_json(client, f"/chat/conversations/{conversation.pk}/update/", {field: value})
    assert response.status_code == 400 and field in response.json()["errors"]


def test_csrf_protection_stays_on(alice, make_conversation):
    from django.test import Client

    conversation = make_conversation(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = post_json(client, f"/chat/conversations/{conversation.pk}/delete/")
    assert response.status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def test_delete_hides_the_conversation_and_housekeeping_purges_its_messages(
    client, alice, make_conversation, settings
):
    conversation = make_conversation(alice)
    tree_ops.send_message(conversation, "one")
    tree_ops.send_message(conversation, "two")
    keep = make_conversation(alice)
    tree_ops.send_message(keep, "kept")
    client.force_login(alice)
    assert post_json(client, f"/chat/conversations/{conversation.pk}/delete/").json() == {
        "deleted": conversation.pk
    }
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert client.get(f"/chat/conversations/{conversation.pk}/").status_code == 404
    assert [c["id"] for c in client.get("/chat/conversations/").json()["conversations"]] == [keep.pk]

    settings.DELETED_CONVERSATION_RETENTION_DAYS = 0
    assert purge_deleted_conversations() == 1
    assert not Conversation.all_objects.filter(pk=conversation.pk).exists()
    assert list(Message.objects.values_list("content", flat=True).filter(role="user")) == ["kept"]


def test_the_thread_endpoint_returns_the_visible_branch(client, alice, make_conversation):
    conversation = make_conversation(alice)
    tree_ops.send_message(conversation, "hello")
    client.force_login(alice)
    data = client.get(f"/chat/conversations/{conversation.pk}/").json()
    assert data["conversation"]["id"] == conversation.pk
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][0]["siblings"] == [data["messages"][0]["id"]]


def test_a_streaming_answer_nobody_has_touched_for_long_is_shown_interrupted(
    client, alice, make_conversation
):
    from datetime import timedelta

    from django.utils import timezone

    conversation = make_conversation(alice)
    _, answer = tree_ops.send_message(conversation, "hello")
    Message.objects.filter(pk=answer.pk).update(
        content="half an ans", updated_at=timezone.now() - timedelta(hours=1)
    )
    client.force_login(alice)
    data = client.get(f"/chat/conversations/{conversation.pk}/").json()
    assert (
        data["messages"][-1]["status"] == "interrupted" and data["messages"][-1]["content"] == "half an ans"
    )
    answer.refresh_from_db()
    assert answer.status == Message.Status.INTERRUPTED
