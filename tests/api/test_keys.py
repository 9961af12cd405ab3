"""API keys: the management command, the settings page and the admin. Keys are shown once, stored hashed."""

from __future__ import annotations

import hashlib
import io
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from conversations.models import ApiKey, ApiRequest

KEY_RE = re.compile(r"sk-[A-Za-z0-9_\-]{40,}")


def sha256(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@pytest.mark.smoke
def test_create_api_key_prints_the_new_key_alone_on_its_last_line(make_user):
    user = make_user("carol")
    out = io.StringIO()
    call_command("create_api_key", "carol", "--name", "cli", stdout=out, stderr=io.StringIO())
    raw = out.getvalue().strip().splitlines()[-1]
    assert KEY_RE.fullmatch(raw)
    key = ApiKey.objects.get(owner=user)
    assert key.name == "cli"
    assert key.hashed_key == sha256(raw) and key.prefix == raw[:12]
    assert raw not in {key.hashed_key, key.prefix}
    assert ApiKey.objects.find(raw) == key


def test_create_api_key_refuses_an_unknown_user(db):
    with pytest.raises(CommandError):
        call_command("create_api_key", "nobody", stdout=io.StringIO())


def test_the_settings_page_needs_a_login(client):
    response = client.get("/settings/api-keys/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.smoke
def test_a_user_creates_a_key_that_is_shown_once_then_revokes_it(client, make_user):
    user = make_user("dave")
    client.force_login(user)
    assert client.get("/settings/api-keys/").status_code == 200

    response = client.post("/settings/api-keys/", {"name": "laptop"})
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("no-store") or "no-store" in response["Cache-Control"]
    [raw] = set(KEY_RE.findall(response.content.decode()))
    key = ApiKey.objects.get(owner=user)
    assert (key.name, key.hashed_key) == ("laptop", sha256(raw))

    page = client.get("/settings/api-keys/").content.decode()
    assert raw not in page and key.prefix in page and "laptop" in page

    response = client.post(f"/settings/api-keys/{key.pk}/revoke/")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert "Revoked" in client.get("/settings/api-keys/").content.decode()


def test_a_user_cannot_revoke_someone_elses_key(client, make_user):
    owner, other = make_user("erin"), make_user("frank")
    key, _raw = ApiKey.objects.create_key(owner)
    client.force_login(other)
    assert client.post(f"/settings/api-keys/{key.pk}/revoke/").status_code == 404
    assert client.get(f"/settings/api-keys/{key.pk}/revoke/").status_code == 405
    key.refresh_from_db()
    assert key.revoked_at is None


def test_the_settings_page_shows_usage(client, make_user):
    user = make_user("gina")
    key, _raw = ApiKey.objects.create_key(user, name="batch")
    ApiRequest.objects.create(
        key=key, owner=user, endpoint="/v1/chat/completions", prompt_tokens=7, completion_tokens=5
    )
    client.force_login(user)
    page = " ".join(client.get("/settings/api-keys/").content.decode().split())
    assert "1 request (0 failed), 7 prompt and 5 completion tokens" in page


@pytest.fixture
def admin_client_(client, db):
    admin = get_user_model().objects.create_superuser(
        "root", "root@example.com", "a-long-unusual-passphrase-42"
    )
    client.force_login(admin)
    return client


def test_an_admin_creates_a_key_shown_once_and_revokes_it(admin_client_, make_user):
    user = make_user("hank")
    response = admin_client_.post(
        "/admin/conversations/apikey/add/", {"owner": user.pk, "name": "ops"}, follow=True
    )
    assert response.status_code == 200
    [raw] = set(KEY_RE.findall(response.content.decode()))
    key = ApiKey.objects.get(owner=user)
    assert key.hashed_key == sha256(raw) and key.name == "ops"
    change_page = admin_client_.get(f"/admin/conversations/apikey/{key.pk}/change/").content.decode()
    assert raw not in change_page and key.hashed_key not in change_page

    response = admin_client_.post(
        "/admin/conversations/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]}, follow=True
    )
    assert response.status_code == 200
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_the_admin_lists_api_requests_read_only(admin_client_, make_user):
    user = make_user("ivy")
    key, _raw = ApiKey.objects.create_key(user)
    ApiRequest.objects.create(key=key, owner=user, endpoint="/v1/completions", model="tiny", status_code=200)
    page = admin_client_.get("/admin/conversations/apirequest/")
    assert page.status_code == 200 and "/v1/completions" in page.content.decode()
    assert admin_client_.get("/admin/conversations/apirequest/add/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_keys_made_at_once_are_counted_one_by_one(make_user, monkeypatch):
    """Three keys asked for together by a user allowed one active key: one is made. Each
    request waits here, past its count, for the other two (half a second at most): counts
    taken before any key was made would let all three be made."""
    from django.db import connection

    from conversations.api import key_pages

    monkeypatch.setattr(key_pages, "MAX_ACTIVE_KEYS", 1)
    user = make_user()
    counted, arrived = [0], threading.Condition()
    create_key = ApiKey.objects.create_key

    def wait_then_create(*args, **kwargs):
        with arrived:
            counted[0] += 1
            arrived.notify_all()
            arrived.wait_for(lambda: counted[0] >= 3, 0.5)
        return create_key(*args, **kwargs)

    monkeypatch.setattr(ApiKey.objects, "create_key", wait_then_create)

    def ask(_: int) -> int:
        client = Client()
        client.force_login(user)
        try:
            return client.post("/settings/api-keys/", {"name": "k"}).status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=3) as pool:
        statuses = sorted(pool.map(ask, range(3)))
    assert statuses == [200, 400, 400]
    assert ApiKey.objects.filter(owner=user).count() == 1
