"""Text out of every accepted kind, and a clear error on each kind of bad file."""

from __future__ import annotations

import pytest

from conversations.documents.extract import extract
from conversations.documents.formats import DocumentError, kind_of
from tests.documents.conftest import make_docx, make_encrypted_pdf, make_zip_bomb_docx
from tests.support.minimal_pdf import make_pdf


def read(name: str, data: bytes) -> str:
    return extract(name, kind_of(name), data, max_pages=100).text


@pytest.mark.smoke
def test_each_kind_gives_its_text_with_headings_marked():
    assert read("a.txt", b"plain words\n\nsecond") == "plain words\n\nsecond"
    assert read("a.md", b"# Title\n\nbody") == "# Title\n\nbody"
    assert read("a.py", b"def f():\n    return 1\n") == "def f():\n    return 1"
    html = b"<html><head><title>T</title><style>p{}</style></head><body><h2>Part</h2><p>One &amp; two</p>"
    html += b"<script>alert(1)</script><p>Three</p></body></html>"
    assert read("a.html", html) == "T\n\n## Part\n\nOne & two\n\nThree"
    docx = make_docx([("Chapter", "Heading 1"), ("Body text.", None), ("Sub", "Heading 2")])
    assert read("a.docx", docx) == "# Chapter\n\nBody text.\n\n## Sub"
    pdf = extract("a.pdf", "pdf", make_pdf("Page words here.\n" * 120, lines_per_page=50), max_pages=10)
    assert pdf.pages == 3 and pdf.text.count("Page words here.") == 120


def test_progress_reaches_the_end():
    seen: list[float] = []
    extract("a.pdf", "pdf", make_pdf("x\n" * 200, lines_per_page=50), max_pages=10, progress=seen.append)
    assert seen[-1] == 1.0 and seen == sorted(seen) and len(seen) >= 4


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("secret.pdf", make_encrypted_pdf("hidden"), "encrypted"),
        ("broken.pdf", make_pdf("text " * 100)[:300], "damaged"),
        ("fake.pdf", b"hello, not a pdf", "not a PDF"),
        ("bomb.docx", make_zip_bomb_docx(), "ZIP bomb"),
        ("notzip.docx", b"PK\x03\x04garbage", "damaged"),
        ("binary.txt", b"\x7fELF\x00\x00\x01", "binary"),
        ("latin.txt", "caf\u00e9".encode("latin-1"), "not UTF-8"),
        ("empty.md", b"", "empty"),
        ("blank.txt", b"   \n\n", "no text"),
        ("tool.exe", b"MZ", "not supported"),
    ],
)
def test_bad_files_get_a_clear_error_naming_them(name, data, says):
    with pytest.raises(DocumentError) as caught:
        read(name, data)
    assert name in str(caught.value) and says in str(caught.value)


def test_too_many_pages_is_refused_before_reading_them():
    with pytest.raises(DocumentError, match="5 pages; at most 2"):
        extract("long.pdf", "pdf", make_pdf("\n".join(["line"] * 250), lines_per_page=50), max_pages=2)
