"""The site's session store: Django's database sessions with a prepared read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.utils import timezone

from conversations.accounts.sessions import SessionStore

pytestmark = pytest.mark.django_db


def test_the_site_uses_it():
    assert settings.SESSION_ENGINE == "conversations.accounts.sessions"


def test_a_saved_session_loads_and_an_unknown_key_starts_empty():
    store = SessionStore()
    store["cart"] = ["é", 2]
    store.save()
    assert SessionStore(store.session_key)["cart"] == ["é", 2]
    unknown = SessionStore("no-such-session-key-at-all")
    assert unknown.load() == {}
    assert unknown.session_key is None  # as Django's: a new key is made on save


def test_an_expired_session_is_not_loaded(django_assert_num_queries):
    store = SessionStore()
    store["user"] = 1
    store.save()
    Session.objects.filter(session_key=store.session_key).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    with django_assert_num_queries(1):
        assert SessionStore(store.session_key).load() == {}


def test_a_signed_in_page_and_a_signed_out_one(client, make_user):
    user = make_user("alice")
    assert client.get("/").status_code in (302, 200)
    client.force_login(user)
    page = client.get("/")
    assert page.wsgi_request.user == user
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    assert client.get("/").wsgi_request.user.is_anonymous
