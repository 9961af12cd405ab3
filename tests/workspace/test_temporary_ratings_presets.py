"""Temporary chats (kept out of the list, never titled, purged when closed or after an hour),
ratings with their JSONL preference export, and prompt presets."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from conversations.chat import titles
from conversations.chat import tree as tree_ops
from conversations.chat.housekeeping import purge_temporary_conversations
from conversations.models import Conversation, Message, Preset, Rating
from conversations.workspace.preferences import preference_lines
from tests.workspace.conftest import finish, post_json, signed_in

pytestmark = pytest.mark.django_db


@pytest.mark.smoke
def test_a_temporary_chat_is_not_listed_titled_or_kept(alice):
    client = signed_in(alice)
    created = post_json(client, "/chat/conversations/new/", {"temporary": True}).json()["conversation"]
    assert created["temporary"] is True
    temporary = Conversation.objects.get(pk=created["id"])
    _, answer = tree_ops.send_message(temporary, "secret question")
    finish(answer, "secret answer")
    kept = Conversation.objects.create(owner=alice, title="Kept")
    assert [c["id"] for c in client.get("/chat/conversations/").json()["conversations"]] == [kept.pk]
    assert client.get("/chat/conversations/?q=secret").json()["conversations"] == []
    assert not titles.is_first_answer(answer.pk) and titles.first_exchange(temporary.pk) is None
    # A normal "new chat" never reuses a temporary one.
    normal = post_json(client, "/chat/conversations/new/").json()["conversation"]
    assert normal["id"] != temporary.pk and normal["temporary"] is False
    # Not exported either.
    exported = json.loads(client.get(f"/conversations/{kept.pk}/export.json").content)
    assert [c["title"] for c in exported["conversations"]] == ["Kept"]
    assert client.get(f"/conversations/{temporary.pk}/export.json").status_code == 404

    # Closing it (the tab left) hides it at once; housekeeping purges it with its messages.
    assert post_json(client, f"/chat/conversations/{kept.pk}/close/").json() == {"closed": False}
    assert (
        post_json(
            signed_in(get_user_model().objects.create(username="eve")),
            f"/chat/conversations/{temporary.pk}/close/",
        ).status_code
        == 404
    )
    assert post_json(client, f"/chat/conversations/{temporary.pk}/close/").json() == {"closed": True}
    assert not Conversation.objects.filter(pk=temporary.pk).exists()
    assert purge_temporary_conversations() == 1
    assert not Conversation.all_objects.filter(pk=temporary.pk).exists()
    assert not Message.objects.filter(content__startswith="secret").exists()
    assert Conversation.objects.filter(pk=kept.pk).exists()


def test_an_unclosed_temporary_chat_goes_after_an_hour(settings, alice):
    settings.TEMPORARY_CHAT_MAX_AGE_SECONDS = 3600
    fresh = Conversation.objects.create(owner=alice, temporary=True)
    old = Conversation.objects.create(owner=alice, temporary=True)
    Conversation.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=61))
    normal = Conversation.objects.create(owner=alice)
    Conversation.objects.filter(pk=normal.pk).update(created_at=timezone.now() - timedelta(days=3))
    assert purge_temporary_conversations() == 1
    assert set(Conversation.all_objects.values_list("pk", flat=True)) == {fresh.pk, normal.pk}
    assert "purge-temporary-conversations" in settings.CELERY_BEAT_SCHEDULE


def test_rating_answers_and_the_thread_shows_them(regenerated, alice, bob):
    conversation, question, first, second = regenerated
    client = signed_in(alice)
    url = f"/chat/messages/{second.pk}/rate/"
    assert post_json(client, url, {"value": 1, "reason": " exact "}).json()["rating"] == {
        "value": 1,
        "reason": "exact",
    }
    assert post_json(client, url, {"value": -1}).json()["rating"] == {"value": -1, "reason": ""}
    assert Rating.objects.get(message=second).value == -1
    thread = client.get(f"/chat/conversations/{conversation.pk}/").json()["messages"]
    assert [m["rating"] for m in thread] == [None, {"value": -1, "reason": ""}]
    assert post_json(client, url, {"value": 0}).json()["rating"] is None
    assert not Rating.objects.exists()

    for bad in ({"value": 2}, {"value": True}, {"value": 1, "reason": "x" * 1001}, {"value": 1, "reason": 5}):
        assert post_json(client, url, bad).status_code == 400, bad
    assert post_json(client, f"/chat/messages/{question.pk}/rate/", {"value": 1}).status_code == 404
    assert post_json(signed_in(bob), url, {"value": 1}).status_code == 404
    assert post_json(Client(), url, {"value": 1}).status_code == 401
    _, streaming = tree_ops.send_message(conversation, "more?")
    assert post_json(client, f"/chat/messages/{streaming.pk}/rate/", {"value": 1}).status_code == 400


def test_the_jsonl_export_pairs_a_regenerated_answer(regenerated, admin_client):
    conversation, question, first, second = regenerated
    Rating.objects.create(message=first, value=-1, reason="wrong sum")
    Rating.objects.create(message=second, value=1)
    ratings = Rating.objects.select_related("message", "message__conversation").order_by("message_id")
    lines = list(preference_lines(ratings))
    pairs = [line for line in lines if line["type"] == "pair"]
    assert len(pairs) == 1
    prompt = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 2+2?"}]
    assert pairs[0]["prompt"] == prompt
    assert (pairs[0]["chosen"], pairs[0]["rejected"]) == ("Four: $2+2=4$.", "Five.")
    assert pairs[0]["rejected_reason"] == "wrong sum"
    assert sorted(line["rating"] for line in lines if line["type"] == "rating") == [-1, 1]
    # A filtered export (thumbs down only) still finds the pair through its sibling.
    only_down = [line for line in preference_lines(ratings.filter(value=-1)) if line["type"] == "pair"]
    assert len(only_down) == 1

    # The admin: the list with its filters, and the export action.
    page = admin_client.get("/admin/conversations/rating/?value__exact=-1&has_reason=yes")
    assert page.status_code == 200 and b"wrong sum" in page.content and b"Four: $2" not in page.content
    reply = admin_client.post(
        "/admin/conversations/rating/",
        {"action": "export_jsonl", "_selected_action": [r.pk for r in Rating.objects.all()]},
    )
    assert reply.status_code == 200 and reply["Content-Type"].startswith("application/jsonl")
    exported = [json.loads(line) for line in reply.content.decode().splitlines()]
    assert [line["type"] for line in exported].count("pair") == 1


def test_presets_are_per_user_plus_site_wide_and_start_a_conversation(alice, bob):
    site = Preset.objects.create(owner=None, name="Site tutor", system_prompt="Teach.", temperature=0.2)
    client = signed_in(alice)
    page = client.post(
        "/settings/presets/",
        {
            "name": "Poet",
            "system_prompt": "Rhyme.",
            "temperature": 1.1,
            "top_p": 0.9,
            "top_k": 20,
            "max_tokens": 64,
        },
    )
    assert page.status_code == 302
    poet = Preset.objects.get(name="Poet")
    assert poet.owner == alice
    bad = client.post(
        "/settings/presets/", {"name": "Hot", "temperature": 9, "top_p": 1, "top_k": 0, "max_tokens": 5}
    )
    assert bad.status_code == 400 and not Preset.objects.filter(name="Hot").exists()
    assert [p["name"] for p in client.get("/chat/presets/").json()["presets"]] == ["Poet", "Site tutor"]
    assert [p["name"] for p in signed_in(bob).get("/chat/presets/").json()["presets"]] == ["Site tutor"]
    assert b"Poet" not in signed_in(bob).get("/settings/presets/").content

    started = post_json(client, "/chat/conversations/new/", {"preset_id": poet.pk}).json()["conversation"]
    assert (started["system_prompt"], started["temperature"], started["top_k"], started["max_tokens"]) == (
        "Rhyme.",
        1.1,
        20,
        64,
    )
    other = post_json(signed_in(bob), "/chat/conversations/new/", {"preset_id": poet.pk}).json()[
        "conversation"
    ]
    assert other["system_prompt"] == ""  # not bob's to use
    from_site = post_json(signed_in(bob), "/chat/conversations/new/", {"preset_id": site.pk}).json()
    assert from_site["conversation"]["system_prompt"] == "Teach."
    # Only the owner deletes a preset; nobody deletes a site-wide one from the site.
    assert signed_in(bob).post(f"/settings/presets/{poet.pk}/delete/").status_code == 404
    assert client.post(f"/settings/presets/{site.pk}/delete/").status_code == 404
    assert client.post(f"/settings/presets/{poet.pk}/delete/").status_code == 302
    assert not Preset.objects.filter(pk=poet.pk).exists()
    chat = client.get("/")
    assert chat.status_code == 200 and b"Site tutor" in chat.content  # in the page's boot state
