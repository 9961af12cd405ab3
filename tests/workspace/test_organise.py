"""Pins, folders, the archive and bulk actions: the JSON endpoints and the conversation list."""

from __future__ import annotations

import pytest
from django.test import Client

from conversations.models import Conversation, Folder
from tests.workspace.conftest import post_json, signed_in

pytestmark = pytest.mark.django_db


def listed(client, query: str = "", archived: bool = False) -> list[dict]:
    url = f"/chat/conversations/?q={query}" + ("&archived=1" if archived else "")
    return client.get(url).json()["conversations"]


@pytest.mark.smoke
def test_pin_folder_and_archive_one_conversation(alice):
    client = signed_in(alice)
    older = Conversation.objects.create(owner=alice, title="Older")
    newer = Conversation.objects.create(owner=alice, title="Newer")
    assert [c["title"] for c in listed(client)] == ["Newer", "Older"]

    assert post_json(client, f"/chat/conversations/{older.pk}/organise/", {"pinned": True}).status_code == 200
    rows = listed(client)
    assert [(c["title"], c["pinned"]) for c in rows] == [("Older", True), ("Newer", False)]

    folder = post_json(client, "/chat/folders/new/", {"name": "  Work   stuff "}).json()["folder"]
    assert folder["name"] == "Work stuff"
    assert post_json(client, "/chat/folders/new/", {"name": "Work stuff"}).status_code == 400
    assert post_json(client, "/chat/folders/new/", {"name": ""}).status_code == 400
    post_json(client, f"/chat/conversations/{newer.pk}/organise/", {"folder_id": folder["id"]})
    assert {c["id"]: c["folder_id"] for c in listed(client)}[newer.pk] == folder["id"]

    # Archived: gone from the list, in the archive view, found by search, restorable.
    post_json(client, f"/chat/conversations/{newer.pk}/organise/", {"archived": True})
    assert [c["id"] for c in listed(client)] == [older.pk]
    assert [c["id"] for c in listed(client, archived=True)] == [newer.pk]
    found = listed(client, "Newer")
    assert [(c["id"], c["archived"]) for c in found] == [(newer.pk, True)]
    post_json(client, f"/chat/conversations/{newer.pk}/organise/", {"archived": False})
    assert {c["id"] for c in listed(client)} == {older.pk, newer.pk}

    # Renaming and deleting the folder: its chats stay, out of any folder.
    assert post_json(client, f"/chat/folders/{folder['id']}/rename/", {"name": "Job"}).status_code == 200
    assert Folder.objects.get(pk=folder["id"]).name == "Job"
    assert post_json(client, f"/chat/folders/{folder['id']}/delete/").status_code == 200
    newer.refresh_from_db()
    assert newer.folder_id is None and newer.deleted_at is None


def test_another_users_folder_and_conversation_are_refused(alice, bob):
    mine = Conversation.objects.create(owner=alice, title="Mine")
    theirs = Conversation.objects.create(owner=bob, title="Theirs")
    their_folder = Folder.objects.create(owner=bob, name="Bob's")
    client = signed_in(alice)
    assert (
        post_json(client, f"/chat/conversations/{theirs.pk}/organise/", {"pinned": True}).status_code == 404
    )
    assert (
        post_json(
            client, f"/chat/conversations/{mine.pk}/organise/", {"folder_id": their_folder.pk}
        ).status_code
        == 400
    )
    assert post_json(client, f"/chat/folders/{their_folder.pk}/rename/", {"name": "x"}).status_code == 404
    assert post_json(client, f"/chat/folders/{their_folder.pk}/delete/").status_code == 404
    assert client.get("/chat/folders/").json() == {"folders": []}
    # A bulk action leaves out what is not the user's.
    reply = post_json(client, "/chat/conversations/bulk/", {"action": "archive", "ids": [mine.pk, theirs.pk]})
    assert reply.json()["changed"] == 1
    theirs.refresh_from_db()
    assert theirs.archived_at is None
    assert post_json(signed_in(bob), "/chat/folders/new/", {"name": "Bob's"}).status_code == 400
    assert post_json(client, "/chat/folders/new/", {"name": "Bob's"}).status_code == 201  # names are per user
    assert signed_in(alice).get("/chat/folders/").status_code == 200
    assert post_json(Client(), "/chat/folders/new/", {"name": "x"}).status_code == 401


def test_bulk_archive_restore_move_pin_and_delete(alice):
    client = signed_in(alice)
    chats = [Conversation.objects.create(owner=alice, title=f"Chat {i}") for i in range(4)]
    ids = [c.pk for c in chats]
    folder = Folder.objects.create(owner=alice, name="Box")

    def bulk(action, chosen, **extra):
        reply = post_json(client, "/chat/conversations/bulk/", {"action": action, "ids": chosen, **extra})
        assert reply.status_code == 200, reply.content
        return reply.json()["changed"]

    assert bulk("move", ids[:2], folder_id=folder.pk) == 2
    assert set(Conversation.objects.filter(folder=folder).values_list("pk", flat=True)) == set(ids[:2])
    assert bulk("move", ids[:1], folder_id=None) == 1
    assert bulk("pin", ids[2:]) == 2
    assert bulk("archive", ids[1:3]) == 2
    assert {c["id"] for c in listed(client)} == {ids[0], ids[3]}
    assert bulk("restore", ids[1:2]) == 1
    assert bulk("delete", ids[:2]) == 2
    assert {c["id"] for c in listed(client)} == {ids[3]}
    assert Conversation.all_objects.filter(pk__in=ids[:2], deleted_at__isnull=False).count() == 2

    for bad in (
        {"action": "explode", "ids": ids},
        {"action": "archive", "ids": []},
        {"action": "archive", "ids": ["1"]},
        {"action": "archive", "ids": list(range(501))},
        {"action": "move", "ids": ids, "folder_id": 999_999},
    ):
        assert post_json(client, "/chat/conversations/bulk/", bad).status_code == 400, bad
    assert (
        client.post("/chat/conversations/bulk/", "not json", content_type="application/json").status_code
        == 400
    )
