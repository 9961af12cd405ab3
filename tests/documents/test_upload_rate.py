"""Uploads are rate-limited per user: each is read and embedded in the background, so
deleting and uploading again must not repeat that work freely."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.documents.test_site import client_for, upload


@pytest.mark.django_db
def test_uploads_past_the_hourly_limit_are_429_and_other_users_are_not_held(make_user, settings):
    settings.DOCUMENT_UPLOADS_PER_HOUR = 2
    alice = client_for(make_user("alice"))
    assert upload(alice, "a.txt", b"one")[0] == 201
    status, body = upload(alice, "b.txt", b"two")
    assert status == 201
    # Deleting a file does not give its upload back.
    assert alice.post(f"/documents/{body['document']['id']}/delete/").status_code == 302
    response = alice.post("/documents/upload/", {"file": SimpleUploadedFile("b.txt", b"two")})
    assert response.status_code == 429
    assert response.json()["code"] == "rate_limited"
    assert "2 files in the last hour" in response.json()["detail"]
    assert 1 <= int(response["Retry-After"]) <= 3600
    bob = client_for(make_user("bob"))
    assert upload(bob, "c.txt", b"three")[0] == 201
