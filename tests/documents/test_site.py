"""Uploads, the extraction job, ownership and caps, through the site's views."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from conversations.documents import jobs
from conversations.documents.formats import DocumentError
from conversations.documents.jobs import run_extraction
from conversations.models import Conversation, ConversationDocument, Document, DocumentChunk
from tests.documents.conftest import make_zip_bomb_docx

STORY = "# Lighthouses\n\n" + "\n\n".join(
    f"## Part {i}\n\nThe keeper of lighthouse {i} trims the wick at dusk. " * 3 for i in range(12)
)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def upload(client: Client, name: str, data: bytes, **extra) -> tuple[int, dict]:
    response = client.post("/documents/upload/", {"file": SimpleUploadedFile(name, data), **extra})
    return response.status_code, response.json()


@pytest.mark.smoke
@pytest.mark.django_db
def test_upload_extract_chunk_and_embed(make_user, tiny_engine):
    user = make_user()
    client = client_for(user)
    status, body = upload(client, "lighthouses.md", STORY.encode())
    assert status == 201 and body["document"]["status"] == "pending"
    doc_id = body["document"]["id"]
    run_extraction(doc_id)  # the job (after the commit in a real request)
    doc = Document.objects.get(pk=doc_id)
    assert (doc.status, doc.progress, doc.payload) == ("ready", 100, None)
    assert doc.text == STORY.strip() and doc.num_tokens > 100 and doc.embedding_model
    chunks = list(DocumentChunk.objects.filter(document=doc))
    assert len(chunks) >= 2 and all(c.owner_id == user.pk for c in chunks)
    vectors = np.stack([np.frombuffer(bytes(c.embedding), dtype="<f4") for c in chunks])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert client.get(f"/documents/{doc_id}/").json()["document"]["status"] == "ready"
    assert [d["id"] for d in client.get("/documents/").json()["documents"]] == [doc_id]


@pytest.mark.django_db
def test_a_bad_file_fails_alone_with_its_reason(make_user, tiny_engine):
    user = make_user()
    client = client_for(user)
    _, good = upload(client, "good.txt", b"Some fine text about rivers.")
    _, bomb = upload(client, "bomb.docx", make_zip_bomb_docx())
    run_extraction(bomb["document"]["id"])
    run_extraction(good["document"]["id"])
    failed = Document.objects.get(pk=bomb["document"]["id"])
    assert failed.status == "failed" and "ZIP bomb" in failed.error and failed.payload is None
    assert Document.objects.get(pk=good["document"]["id"]).status == "ready"
    page = client.get("/settings/documents/").content.decode()
    assert "ZIP bomb" in page and "good.txt" in page


@pytest.mark.django_db
def test_refused_uploads_say_why(make_user, settings):
    settings.DOCUMENT_MAX_BYTES = 1000
    settings.DOCUMENT_USER_MAX_BYTES = 1500
    client = client_for(make_user())
    status, body = upload(client, "huge.txt", b"x" * 2000)
    assert status == 400 and "at most 1,000" in body["detail"]
    status, body = upload(client, "a.txt", b"fine", conversation_id="not-a-number")
    assert status == 400 and body["code"] == "invalid"
    status, body = upload(client, "tool.exe", b"MZ")
    assert status == 400 and "not supported" in body["detail"]
    assert upload(client, "a.txt", b"y" * 900)[0] == 201
    status, body = upload(client, "b.txt", b"z" * 900)
    assert status == 400 and "limit is 1,500" in body["detail"]
    assert Document.objects.count() == 1


@pytest.mark.django_db
def test_another_users_documents_are_invisible(make_user, tiny_engine):
    alice, bob = make_user("alice"), make_user("bob")
    a, b = client_for(alice), client_for(bob)
    _, body = upload(a, "private.txt", b"alice's secret")
    doc_id = body["document"]["id"]
    run_extraction(doc_id)
    conversation = Conversation.objects.create(owner=bob)
    assert b.get(f"/documents/{doc_id}/").status_code == 404
    assert b.get(f"/documents/{doc_id}/passage/?start=0&end=5").status_code == 404
    assert b.post(f"/documents/{doc_id}/delete/").status_code == 404
    attach = b.post(
        f"/chat/conversations/{conversation.pk}/documents/",
        {"document_id": doc_id},
        content_type="application/json",
    )
    assert attach.status_code == 404 and not ConversationDocument.objects.exists()
    assert b.get("/documents/").json()["documents"] == []
    theirs = Conversation.objects.create(owner=alice)
    into_theirs = {
        "file": SimpleUploadedFile("x.txt", b"into alice's chat"),
        "conversation_id": str(theirs.pk),
    }
    assert b.post("/documents/upload/", into_theirs).status_code == 404
    assert Document.objects.filter(owner=bob).count() == 0
    assert "private.txt" not in b.get("/settings/documents/").content.decode()
    assert Document.objects.filter(pk=doc_id).exists()


@pytest.mark.django_db
def test_attach_from_the_library_open_the_passage_and_delete(make_user, tiny_engine):
    user = make_user()
    client = client_for(user)
    _, body = upload(client, "notes.txt", b"alpha beta gamma delta")
    doc_id = body["document"]["id"]
    run_extraction(doc_id)
    conversation = Conversation.objects.create(owner=user)
    url = f"/chat/conversations/{conversation.pk}/documents/"
    listed = client.post(url, {"document_id": doc_id}, content_type="application/json").json()
    assert [d["id"] for d in listed["documents"]] == [doc_id]
    page = client.get(f"/documents/{doc_id}/passage/?start=6&end=10").content.decode()
    assert '<mark id="passage" class="passage" tabindex="-1">beta</mark>' in page
    client.post(f"/chat/conversations/{conversation.pk}/documents/{doc_id}/detach/")
    assert client.get(url).json()["documents"] == []
    response = client.post(f"/documents/{doc_id}/delete/", HTTP_ACCEPT="application/json")
    assert response.json() == {"deleted": doc_id} and not Document.objects.exists()
    assert not DocumentChunk.objects.exists()


@pytest.mark.django_db
def test_a_file_whose_job_was_lost_ends_failed(make_user):
    from datetime import timedelta

    from django.utils import timezone

    user = make_user()
    client = client_for(user)
    _, body = upload(client, "lost.txt", b"never read")
    Document.objects.filter(pk=body["document"]["id"]).update(created_at=timezone.now() - timedelta(hours=1))
    listed = client.get("/documents/").json()["documents"][0]
    assert listed["status"] == "failed" and "upload it again" in listed["error"]


@pytest.mark.django_db(transaction=True)
def test_uploads_at_once_are_checked_against_the_caps_one_by_one(make_user, settings, monkeypatch):
    """Three uploads together from a user allowed one file: one is stored, two are refused.
    Each upload's check waits here for the other two (half a second at most): checks that
    counted the files before any upload was stored would let all three in."""
    from django.db import connection

    settings.DOCUMENT_USER_MAX_FILES = 1
    monkeypatch.setattr(jobs, "_thread", lambda pk: None)  # no extraction job in this test
    monkeypatch.setattr(jobs, "enqueue_on_commit", lambda *args: None)
    user = make_user()
    checked, arrived = [0], threading.Condition()
    check_caps = jobs.check_caps

    def check_then_wait(*args) -> None:
        check_caps(*args)
        with arrived:
            checked[0] += 1
            arrived.notify_all()
            arrived.wait_for(lambda: checked[0] >= 3, 0.5)

    monkeypatch.setattr(jobs, "check_caps", check_then_wait)

    def attempt(i: int) -> str:
        try:
            jobs.start_upload(user, f"notes-{i}.md", b"# Notes")
            return "stored"
        except DocumentError:
            return "refused"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = sorted(pool.map(attempt, range(3)))
    assert outcomes == ["refused", "refused", "stored"]
    assert Document.objects.filter(owner=user).count() == 1
