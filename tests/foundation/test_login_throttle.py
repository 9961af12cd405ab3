"""Login throttling per (username, client), and closing signup."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-unusual-passphrase-42"


def unique_user(make_user):
    # Counters live in the shared cache (Redis under CI), so every test uses fresh names.
    return make_user(f"u-{uuid.uuid4().hex[:10]}", PASSWORD)


def login(client, username: str, password: str, path: str = "/accounts/login/", addr: str = "10.0.0.1"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=addr)


@pytest.mark.smoke
@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_too_many_failed_logins_answer_429_even_with_the_right_password(client, make_user):
    user = unique_user(make_user)
    for _ in range(3):
        assert login(client, user.username, "wrong-password").status_code == 200
    response = login(client, user.username, PASSWORD)
    assert response.status_code == 429
    assert "Retry-After" in response
    assert "_auth_user_id" not in client.session


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_a_locked_username_does_not_lock_other_usernames_or_other_clients(client, make_user):
    locked, other = unique_user(make_user), unique_user(make_user)
    for _ in range(3):
        login(client, locked.username, "wrong-password")
    assert login(client, locked.username, PASSWORD).status_code == 429
    assert login(client, other.username, PASSWORD).status_code == 302
    client.logout()
    assert login(client, locked.username, PASSWORD, addr="10.0.0.2").status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=3, LOGIN_FAILURE_WINDOW=900)
def test_the_lock_ends_when_the_window_passes(client, make_user):
    from django.core.cache import cache

    from conversations.accounts import login_throttle

    user = unique_user(make_user)
    for _ in range(3):
        login(client, user.username, "wrong-password")
    assert login(client, user.username, PASSWORD).status_code == 429
    cache.delete(login_throttle._key(user.username, "10.0.0.1"))  # what the window's expiry does
    assert login(client, user.username, PASSWORD).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_a_successful_login_clears_the_failure_count(client, make_user):
    user = unique_user(make_user)
    for _ in range(2):
        login(client, user.username, "wrong-password")
    assert login(client, user.username, PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):
        login(client, user.username, "wrong-password")
    assert login(client, user.username, PASSWORD).status_code == 302


class WaitingBackend:
    """Refuses every password, after waiting (one second at most) until ``expected``
    attempts are checking theirs at once."""

    expected = 0
    arrived = 0
    lock = threading.Condition()

    def authenticate(self, request, username=None, password=None, **kwargs):
        with WaitingBackend.lock:
            WaitingBackend.arrived += 1
            WaitingBackend.lock.notify_all()
            WaitingBackend.lock.wait_for(lambda: WaitingBackend.arrived >= WaitingBackend.expected, 1.0)
        return None

    def get_user(self, user_id):
        return None


# Transactional: each failed attempt writes its audit entry from its own thread, which the
# test's own open transaction (SQLite's write lock) would otherwise hold off.
@pytest.mark.django_db(transaction=True)
@override_settings(
    LOGIN_FAILURE_LIMIT=3,
    AUTHENTICATION_BACKENDS=["tests.foundation.test_login_throttle.WaitingBackend"],
)
def test_attempts_at_once_cannot_pass_the_limit_together():
    """Ten wrong passwords for one username sent together: three are checked, seven are
    refused before their check (a count read before any failure is recorded would let all
    ten be checked, each backend call waiting for the other nine)."""
    WaitingBackend.expected, WaitingBackend.arrived = 10, 0
    username = f"u-{uuid.uuid4().hex[:10]}"

    def attempt(_: int) -> int:
        return login(Client(), username, "wrong-password").status_code

    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = sorted(pool.map(attempt, range(10)))
    assert statuses == [200] * 3 + [429] * 7
    assert WaitingBackend.arrived == 3
    assert login(Client(), username, "wrong-password").status_code == 429  # the three failures stay


@override_settings(LOGIN_FAILURE_LIMIT=2)
def test_the_admin_login_is_throttled_too(client, make_user):
    user = unique_user(make_user)
    user.is_staff = True
    user.save()
    for _ in range(2):
        assert login(client, user.username, "wrong-password", path="/admin/login/").status_code == 200
    assert login(client, user.username, PASSWORD, path="/admin/login/").status_code == 429


@pytest.mark.smoke
@override_settings(ALLOW_SIGNUP=False)
def test_closed_signup_refuses_new_accounts_and_hides_the_link(client):
    response = client.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "password1": "correct-horse-battery-9",
            "password2": "correct-horse-battery-9",
        },
    )
    assert response.status_code == 404
    assert not get_user_model().objects.filter(username="newbie").exists()
    assert b"/accounts/signup/" not in client.get("/accounts/login/").content


def test_open_signup_shows_the_link_on_the_login_page(client):
    assert b"/accounts/signup/" in client.get("/accounts/login/").content
