"""A file is read (extracted, chunked, counted) in a low-priority child process when the
engine's tokenizer can go with it, so the server's interpreter, which the engine thread
and the event loop share, stays free while an upload is read."""

from __future__ import annotations

import numpy as np
import pytest

from conversations.documents import jobs, reading
from conversations.documents.embedder import get_embedder
from conversations.documents.formats import DocumentError
from conversations.documents.jobs import run_extraction
from conversations.models import Document, DocumentChunk
from tests.documents.conftest import make_zip_bomb_docx
from tests.documents.test_site import STORY, client_for, upload


@pytest.mark.django_db
def test_an_upload_is_read_in_a_child_process_not_in_the_server(make_user, tiny_engine, monkeypatch):
    embedder = get_embedder()
    expected = reading.read(
        "lighthouses.md",
        "markdown",
        STORY.encode(),
        max_pages=10,
        encode=embedder.encode,
        max_input_tokens=embedder.max_input_tokens,
    )

    def not_here(*args, **kwargs):
        raise AssertionError("the file was read in the server process")

    monkeypatch.setattr(jobs, "read", not_here)
    user = make_user()
    status, body = upload(client_for(user), "lighthouses.md", STORY.encode())
    assert status == 201
    run_extraction(body["document"]["id"])
    doc = Document.objects.get(pk=body["document"]["id"])
    assert doc.status == "ready", doc.error
    assert doc.text == expected.extracted.text and doc.num_tokens == expected.num_tokens
    chunks = list(DocumentChunk.objects.filter(document=doc).order_by("index"))
    assert [(c.start, c.end, c.num_tokens) for c in chunks] == [
        (c.start, c.end, c.num_tokens) for c in expected.chunks
    ]
    # The vectors are those of the passages encoded here.
    vectors = np.stack([np.frombuffer(bytes(c.embedding), dtype="<f4") for c in chunks])
    np.testing.assert_allclose(vectors, embedder.embed_ids(expected.inputs), atol=1e-5)


@pytest.mark.django_db
def test_the_childs_document_error_fails_the_file_with_its_reason(tiny_engine):
    tokenizer_json = get_embedder().tokenizer_json()
    assert tokenizer_json is not None
    with pytest.raises(DocumentError, match="refused as a ZIP bomb"):
        reading.read_apart(
            "bomb.docx",
            "docx",
            make_zip_bomb_docx(),
            max_pages=10,
            tokenizer_json=tokenizer_json,
            max_input_tokens=100,
        )
