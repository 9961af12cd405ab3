"""Admin: conversations with their message tree, searchable; a read-only engine status page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from conversations import tree as tree_ops

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
    from conversations import engine

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
    assert engine._engine is None or engine._state == "ready"


def test_engine_status_page_needs_staff(client, make_user):
    client.force_login(make_user("alice"))
    assert client.get("/admin/conversations/enginestatus/").status_code == 302


@pytest.mark.usefixtures("tiny_engine")
def test_engine_status_page_shows_the_loaded_engines_numbers(admin_client):
    from conversations.engine import get_engine

    engine = get_engine()
    stats = engine.stats()
    body = admin_client.get("/admin/conversations/enginestatus/").content.decode()
    assert engine.model_name in body and "ready" in body
    assert f"<td>{stats.kv_blocks_total}</td>" in body
