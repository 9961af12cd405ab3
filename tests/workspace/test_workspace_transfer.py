"""Export and import carry the workspace: pins, archive dates, folders, ratings, presets."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from conversations.models import Conversation, Folder, Preset, Rating
from conversations.transfer import InvalidFile, import_bytes
from conversations.transfer.jobs import render_export

pytestmark = pytest.mark.django_db


@pytest.mark.smoke
def test_export_then_import_keeps_the_workspace_fields(regenerated, alice, bob):
    conversation, _question, first, second = regenerated
    folder = Folder.objects.create(owner=alice, name="Maths")
    Folder.objects.create(owner=alice, name="Empty one")
    archived_at = timezone.now().replace(microsecond=0)
    Conversation.objects.filter(pk=conversation.pk).update(
        pinned=True, folder=folder, archived_at=archived_at
    )
    Rating.objects.create(message=first, value=-1, reason="wrong")
    Rating.objects.create(message=second, value=1)
    Preset.objects.create(owner=alice, name="Terse", system_prompt="Short.", top_k=5)
    Preset.objects.create(owner=None, name="Site-wide", system_prompt="Not alice's")
    Conversation.objects.create(owner=alice, title="Temporary", temporary=True)

    data = json.loads(render_export(alice, "json"))
    assert [c["title"] for c in data["conversations"]] == ["Sums"]  # no temporary chat
    record = data["conversations"][0]
    assert (record["pinned"], record["folder"], record["archived_at"]) == (
        True,
        "Maths",
        archived_at.isoformat(),
    )
    assert sorted(data["folders"]) == ["Empty one", "Maths"]
    assert [p["name"] for p in data["presets"]] == ["Terse"]

    Folder.objects.create(owner=bob, name="Maths")  # an existing folder of that name is reused
    Preset.objects.create(owner=bob, name="Terse", system_prompt="Bob's own")
    result = import_bytes(bob, json.dumps(data).encode())
    copy = Conversation.objects.get(pk=result.conversation_ids[0])
    assert (copy.owner, copy.pinned, copy.archived_at, copy.folder.name) == (bob, True, archived_at, "Maths")
    assert Folder.objects.filter(owner=bob).count() == 2
    ratings = {
        r.message.content: (r.value, r.reason) for r in Rating.objects.filter(message__conversation=copy)
    }
    assert ratings == {"Five.": (-1, "wrong"), "Four: $2+2=4$.": (1, "")}
    assert Preset.objects.get(owner=bob, name="Terse").system_prompt == "Bob's own"  # not replaced

    again = json.loads(render_export(bob, "json"))["conversations"][0]
    assert {k: again[k] for k in ("pinned", "folder", "archived_at")} == {
        k: record[k] for k in ("pinned", "folder", "archived_at")
    }


@pytest.mark.parametrize(
    "change",
    [
        {"pinned": "yes"},
        {"folder": 5},
        {"archived_at": "not a date"},
        {"messages_rating": {"value": 3}},
    ],
)
def test_bad_workspace_fields_save_nothing(regenerated, alice, bob, change):
    data = json.loads(render_export(alice, "json"))
    record = data["conversations"][0]
    if "messages_rating" in change:
        next(m for m in record["messages"] if m["role"] == "assistant")["rating"] = change["messages_rating"]
    else:
        record.update(change)
    with pytest.raises(InvalidFile):
        import_bytes(bob, json.dumps(data).encode())
    assert not Conversation.objects.filter(owner=bob).exists()
