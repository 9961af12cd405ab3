"""Error pages answer in the site's look with a way back: Django's handlers point at
``conversations.error_pages``, a revoked share link answers 410 saying so, and a locked-out
sign-in answers a 429 page."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from django.urls import get_resolver

from conversations import error_pages
from conversations.models import Conversation, Message, Share
from conversations.workspace.sharing import take_snapshot

pytestmark = pytest.mark.django_db


def assert_site_page(body: str, heading: str) -> None:
    assert "/static/css/site.css" in body
    assert f"<h1>{heading}</h1>" in body
    assert 'href="/">Back to your chats</a>' in body


def test_django_handlers_point_at_the_site_pages():
    resolver = get_resolver()
    assert resolver.resolve_error_handler(404) is error_pages.page_not_found
    assert resolver.resolve_error_handler(403) is error_pages.permission_denied
    assert resolver.resolve_error_handler(500) is error_pages.server_error


def test_a_missing_page_and_a_server_error_have_the_site_look(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert_site_page(response.content.decode(), "Page not found")
    response = error_pages.server_error(RequestFactory().get("/"))
    assert response.status_code == 500
    assert_site_page(response.content.decode(), "Something went wrong")
    response = error_pages.permission_denied(RequestFactory().get("/"))
    assert response.status_code == 403
    assert_site_page(response.content.decode(), "Not allowed")


def test_a_revoked_share_link_answers_410_and_says_it_was_revoked(client, django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    conversation = Conversation.objects.create(owner=alice, title="Sums")
    question = Message.objects.create(conversation=conversation, role="user", content="2+2?")
    Message.objects.create(conversation=conversation, parent=question, role="assistant", content="4")
    share = take_snapshot(conversation)
    client.force_login(bob)
    assert client.get(f"/s/{share.token}/").status_code == 200
    Share.objects.filter(pk=share.pk).update(revoked_at=question.created_at)
    for response in (client.get(f"/s/{share.token}/"), client.post(f"/s/{share.token}/continue/")):
        assert response.status_code == 410
        assert_site_page(response.content.decode(), "This share link was revoked")
    assert client.get("/s/not-a-token/").status_code == 404


def test_a_locked_out_sign_in_answers_a_429_page(client, django_user_model, settings):
    settings.LOGIN_FAILURE_LIMIT = 1
    django_user_model.objects.create_user("carol", password="pw-carol-123")
    client.post("/accounts/login/", {"username": "carol", "password": "wrong"})
    response = client.post("/accounts/login/", {"username": "carol", "password": "wrong"})
    assert response.status_code == 429
    assert response["Retry-After"] == str(settings.LOGIN_FAILURE_WINDOW)
    body = response.content.decode()
    assert_site_page(body, "Too many requests")
    assert "Too many failed sign-in attempts for this account." in body
