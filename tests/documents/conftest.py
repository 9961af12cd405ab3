"""Fixtures for the documents tests: the process's engine on the tiny random model, and
files of every kind made on the fly."""

from __future__ import annotations

import io
import zipfile

import pytest
from django.conf import settings


@pytest.fixture(autouse=True)
def _no_model_titles(settings):
    settings.TITLES_FROM_MODEL = False


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """Point conversations.ops.engine_handle at the tiny model for the whole session."""
    from conversations.ops.engine_handle import reset_engine_for_tests

    original = settings.ENGINE
    settings.ENGINE = {**original, "model": str(tiny_model_dir), "kv_cache_gb": 0.25}
    reset_engine_for_tests()
    yield
    reset_engine_for_tests()
    settings.ENGINE = original


def make_docx(paragraphs: list[tuple[str, str | None]]) -> bytes:
    """(text, style) pairs, e.g. ("Intro", "Heading 1")."""
    import docx

    document = docx.Document()
    for text, style in paragraphs:
        document.add_paragraph(text, style=style)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_zip_bomb_docx(inflated_bytes: int = 30_000_000) -> bytes:
    """A DOCX-shaped ZIP whose document.xml inflates to ``inflated_bytes`` of zeros."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", b"\0" * inflated_bytes)
    return out.getvalue()


def make_encrypted_pdf(text: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    from tests.support.minimal_pdf import make_pdf

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(text))))
    writer.encrypt("a secret password")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
