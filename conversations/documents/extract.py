"""Text out of an uploaded file, with headings marked as Markdown (``#``) so chunking can
follow the document's structure.

Limits keep hostile files cheap: a PDF's page count, a DOCX's uncompressed size and
entry count (checked from the ZIP directory before anything is inflated), its XML's size
and element count (read as a stream: ``conversations.documents.docx_text``), and the text
kept. Every failure is a ``DocumentError`` whose message names the file.
"""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

from conversations.documents.docx_text import docx_text
from conversations.documents.formats import DocumentError, check_signature, decode_text
from conversations.documents.html_text import html_to_text

log = logging.getLogger(__name__)

# A DOCX may inflate to at most this many bytes in all, and this many times its own size.
DOCX_MAX_UNCOMPRESSED = 200_000_000
DOCX_MAX_RATIO = 200
DOCX_MAX_ENTRIES = 5_000
# Characters of text kept from one file.
MAX_TEXT_CHARS = 5_000_000

Progress = Callable[[float], None]


@dataclass
class Extracted:
    text: str
    pages: int  # PDF pages; for other kinds, about 3,000 characters a page


def extract(
    filename: str, kind: str, data: bytes, *, max_pages: int, progress: Progress | None = None
) -> Extracted:
    check_signature(filename, kind, data)
    progress = progress or (lambda _share: None)
    if kind == "pdf":
        text, pages = _pdf(filename, data, max_pages, progress)
    elif kind == "docx":
        text = _docx(filename, data)
        pages = 0
    elif kind == "html":
        text, pages = html_to_text(decode_text(filename, data)), 0
    else:
        text, pages = decode_text(filename, data), 0
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise DocumentError(f"{filename} holds no text that could be read (a scanned PDF needs OCR first).")
    if len(text) > MAX_TEXT_CHARS:
        raise DocumentError(f"{filename} holds more than {MAX_TEXT_CHARS:,} characters of text.")
    progress(1.0)
    return Extracted(text, pages or max(1, -(-len(text) // 3000)))


def _pdf(filename: str, data: bytes, max_pages: int, progress: Progress) -> tuple[str, int]:
    from pypdf import PdfReader  # noqa: PLC0415 - only for PDFs
    from pypdf.errors import PdfReadError  # noqa: PLC0415

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{filename} is encrypted with a password; upload an unprotected copy.")
        count = len(reader.pages)
    except DocumentError:
        raise
    except Exception as exc:  # pypdf raises many kinds on a damaged file
        if "crypt" in str(exc).lower():
            raise DocumentError(f"{filename} is encrypted and cannot be read.") from exc
        raise DocumentError(
            f"{filename} is damaged and could not be read as a PDF ({type(exc).__name__})."
        ) from exc
    if count > max_pages:
        raise DocumentError(f"{filename} has {count} pages; at most {max_pages} are read.")
    parts: list[str] = []
    for i, page in enumerate(reader.pages):
        try:
            parts.append(page.extract_text() or "")
        except (PdfReadError, ValueError, KeyError, TypeError) as exc:
            raise DocumentError(f"{filename}: page {i + 1} is damaged ({type(exc).__name__}).") from exc
        progress((i + 1) / count)
    return "\n\n".join(p.strip() for p in parts if p.strip()), count


def check_zip(filename: str, data: bytes) -> None:
    """Refuse a ZIP bomb from its directory alone: the sizes it declares, before inflating."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise DocumentError(f"{filename} is damaged: it is not a readable ZIP archive.") from exc
    with archive:
        entries = archive.infolist()
        if len(entries) > DOCX_MAX_ENTRIES:
            raise DocumentError(f"{filename} holds {len(entries)} files; a DOCX holds far fewer.")
        total = sum(e.file_size for e in entries)
        if total > DOCX_MAX_UNCOMPRESSED or total > DOCX_MAX_RATIO * max(len(data), 1):
            raise DocumentError(
                f"{filename} would inflate to {total:,} bytes from {len(data):,}: refused as a ZIP bomb."
            )
        if "word/document.xml" not in archive.namelist():
            raise DocumentError(f"{filename} is not a Word document (no word/document.xml).")


def _docx(filename: str, data: bytes) -> str:
    check_zip(filename, data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return docx_text(filename, archive)
