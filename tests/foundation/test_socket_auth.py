"""A websocket's user, read with a prepared query, is the one Channels' own auth would give."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.auth import get_user as channels_get_user
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from conversations.accounts.sessions import SessionStore
from conversations.accounts.socket_auth import socket_user

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in_session_key(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def both(session_key: str) -> tuple:
    """(this module's user, Channels' user), each from a freshly loaded session."""
    ours = await socket_user({"session": SessionStore(session_key)})
    theirs = await channels_get_user({"session": SessionStore(session_key)})
    return ours, theirs


def make(make_user, change):
    user = make_user("alice")
    key = signed_in_session_key(user)
    change(user, key)
    return user, key


def password_changed(user, key):
    user.set_password("another-long-passphrase-43")
    user.save()


def deactivated(user, key):
    user.is_active = False
    user.save()


def deleted(user, key):
    user.delete()


def foreign_backend(user, key):
    session = SessionStore(key)
    session[BACKEND_SESSION_KEY] = "somewhere.else.Backend"
    session.save()


async def test_a_signed_in_session_gives_its_user(make_user):
    user, key = await sync_to_async(make)(make_user, lambda user, key: None)
    ours, theirs = await both(key)
    assert ours == theirs == user
    assert ours.is_authenticated


@pytest.mark.parametrize(
    "change", [password_changed, deactivated, deleted, foreign_backend], ids=lambda c: c.__name__
)
async def test_a_session_that_no_longer_holds_gives_no_user(make_user, change):
    _user, key = await sync_to_async(make)(make_user, change)
    ours, theirs = await both(key)
    assert isinstance(ours, AnonymousUser) and isinstance(theirs, AnonymousUser)


async def test_a_stale_password_hash_flushes_the_session(make_user):
    _user, key = await sync_to_async(make)(make_user, password_changed)
    session = SessionStore(key)
    await socket_user({"session": session})
    assert session.session_key is None  # flushed, as Channels and Django do
    assert not await sync_to_async(SessionStore().exists)(key)


async def test_no_session_data_gives_no_user():
    assert isinstance(await socket_user({"session": SessionStore()}), AnonymousUser)
