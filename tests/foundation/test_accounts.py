"""Sign-up, login, logout, and the login requirement on pages and websockets."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.conftest import websocket

pytestmark = pytest.mark.django_db


@pytest.mark.smoke
def test_signup_creates_the_user_signs_them_in_and_opens_the_chat(client):
    response = client.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "password1": "correct-horse-battery-9",
            "password2": "correct-horse-battery-9",
        },
    )
    assert response.status_code == 302 and response.url == reverse("home")
    assert get_user_model().objects.filter(username="newbie").exists()
    assert client.get("/").status_code == 200


def test_weak_signup_password_shows_the_validators_message(client):
    response = client.post(
        "/accounts/signup/", {"username": "weak", "password1": "12345", "password2": "12345"}
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "This password is too short" in body
    assert "This password is entirely numeric" in body
    assert not get_user_model().objects.filter(username="weak").exists()


def test_login_then_logout(client, make_user):
    make_user("bob", "a-long-unusual-passphrase-42")
    response = client.post(
        "/accounts/login/", {"username": "bob", "password": "a-long-unusual-passphrase-42"}
    )
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_wrong_password_is_refused(client, make_user):
    make_user("carol", "a-long-unusual-passphrase-42")
    response = client.post("/accounts/login/", {"username": "carol", "password": "nope"})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


@pytest.mark.smoke
def test_chat_page_requires_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/")


def test_admin_is_served_and_requires_staff(client, make_user):
    assert client.get("/admin/").status_code == 302
    admin = get_user_model().objects.create_superuser(
        "root", "root@example.com", "a-long-unusual-passphrase-42"
    )
    client.force_login(admin)
    assert client.get("/admin/").status_code == 200


@pytest.mark.django_db(transaction=True)
async def test_websocket_refuses_anonymous_user():
    communicator = websocket("/ws/chat/")
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_websocket_accepts_signed_in_user_from_an_allowed_origin(make_user):
    from asgiref.sync import sync_to_async

    user = await sync_to_async(make_user)("dave")
    communicator = await sync_to_async(websocket)("/ws/chat/", user)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_websocket_refuses_a_foreign_origin(make_user):
    from asgiref.sync import sync_to_async

    user = await sync_to_async(make_user)("erin")
    communicator = await sync_to_async(websocket)("/ws/chat/", user, (b"origin", b"http://evil.example"))
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.disconnect()
