"""A DOCX's text, read as a stream with limits: headings marked as Markdown, then tables.

A DOCX is a ZIP holding ``word/document.xml``. A bomb can sit within the archive's overall
ratio (858 KB inflating 176 times to 151 MB of empty paragraphs): a whole-tree parse
(python-docx) then takes gigabytes and minutes. Here

- ``word/document.xml`` (and ``word/styles.xml``) must declare at most
  ``DOCX_MAX_XML_BYTES`` uncompressed, checked from the ZIP directory; the ZIP reader
  stops at the declared size, so a member cannot inflate past it;
- the XML is parsed incrementally from the ZIP member (``lxml.etree.iterparse``), each
  top-level paragraph and table dropped once read, so memory holds one of them at a time;
- more than ``DOCX_MAX_ELEMENTS`` elements is refused as soon as the count passes it;
- entities are never expanded and nothing is fetched (no DTD, no network).

The text is what python-docx gives for the same file: body paragraphs (``w:t`` text, tabs,
line breaks) in order, a heading style as ``#`` marks, then each table's rows with their
cells joined by `` | ``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from typing import IO

from lxml import etree

from conversations.documents.formats import DocumentError

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
DOCUMENT = "word/document.xml"
STYLES = "word/styles.xml"
# Uncompressed bytes of document.xml or styles.xml (a 1,000-page report is about 20 MB).
DOCX_MAX_XML_BYTES = 64_000_000
# Elements of document.xml (paragraphs, runs, properties...: a 1,000-page report has a few hundred thousand).
DOCX_MAX_ELEMENTS = 1_000_000


def docx_text(filename: str, archive: zipfile.ZipFile) -> str:
    """The text of the DOCX in ``archive`` (its directory already checked for a ZIP bomb)."""
    styles = _style_names(filename, archive)
    lines: list[str] = []
    tables: list[str] = []
    for kind, element in _top_level(filename, archive):
        if kind == "p":
            text = _paragraph_text(element).strip()
            if text:
                lines.append(_marked(text, styles.get(_style_id(element), "")))
        else:
            for row in element.iter(f"{W}tr"):
                cells = [c for c in row if c.tag == f"{W}tc"]
                tables.append(" | ".join(_cell_text(c).strip() for c in cells))
    return "\n\n".join(lines + tables)


def _open(filename: str, archive: zipfile.ZipFile, name: str) -> IO[bytes]:
    info = archive.getinfo(name)
    if info.file_size > DOCX_MAX_XML_BYTES:
        raise DocumentError(
            f"{filename}: its {name} would inflate to {info.file_size:,} bytes; at most "
            f"{DOCX_MAX_XML_BYTES:,} are read."
        )
    return archive.open(info)


def _ended(filename: str, stream: IO[bytes], name: str) -> Iterator[etree._Element]:
    """``iterparse``'s elements as each ends, with entities left unexpanded, no DTD and no
    network, and the element count capped."""
    parser = etree.iterparse(
        stream,
        events=("end",),
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        huge_tree=False,
        remove_comments=True,
    )
    count = 0
    try:
        for _event, element in parser:
            count += 1
            if count > DOCX_MAX_ELEMENTS:
                raise DocumentError(
                    f"{filename}: its {name} holds more than {DOCX_MAX_ELEMENTS:,} XML elements; "
                    "refused as too large to read."
                )
            yield element
    except etree.XMLSyntaxError as exc:
        raise DocumentError(f"{filename} is damaged: its {name} is not well-formed XML ({exc.msg}).") from exc
    except zipfile.BadZipFile as exc:
        raise DocumentError(f"{filename} is damaged: its {name} could not be inflated ({exc}).") from exc


def _top_level(filename: str, archive: zipfile.ZipFile) -> Iterator[tuple[str, etree._Element]]:
    """The body's own paragraphs ("p") and tables ("tbl") in order, each complete; each is
    cleared, with what came before it, once the caller moves on."""
    body = f"{W}body"
    with _open(filename, archive, DOCUMENT) as stream:
        for element in _ended(filename, stream, DOCUMENT):
            parent = element.getparent()
            if parent is None or parent.tag != body:
                continue  # inside a paragraph or table: read with it when it ends
            if element.tag in (f"{W}p", f"{W}tbl"):
                yield ("p" if element.tag == f"{W}p" else "tbl"), element
            element.clear()  # read (or section properties and the like: nothing to read)
            while element.getprevious() is not None:
                del parent[0]


def _style_names(filename: str, archive: zipfile.ZipFile) -> dict[str, str]:
    """Paragraph style id -> its name ("Heading1" -> "heading 1"), from styles.xml."""
    if STYLES not in archive.namelist():
        return {}
    names: dict[str, str] = {}
    with _open(filename, archive, STYLES) as stream:
        for element in _ended(filename, stream, STYLES):
            if element.tag == f"{W}style":
                name = element.find(f"{W}name")
                style_id = element.get(f"{W}styleId")
                if style_id and name is not None:
                    names[style_id] = name.get(f"{W}val", "")
                element.clear()
    return names


def _style_id(paragraph: etree._Element) -> str:
    style = paragraph.find(f"{W}pPr/{W}pStyle")
    return "" if style is None else style.get(f"{W}val", "")


def _paragraph_text(paragraph: etree._Element) -> str:
    parts: list[str] = []
    for node in paragraph.iter(f"{W}t", f"{W}tab", f"{W}br", f"{W}cr"):
        if node.tag == f"{W}t":
            parts.append(node.text or "")
        elif node.tag == f"{W}tab":
            parts.append("\t")
        else:
            parts.append("\n")
    return "".join(parts)


def _cell_text(cell: etree._Element) -> str:
    return "\n".join(_paragraph_text(p) for p in cell if p.tag == f"{W}p")


def _marked(text: str, style: str) -> str:
    """A heading style's text as a Markdown heading (python-docx's style names: "heading 1",
    "Heading 2", "Title")."""
    lowered = style.lower()
    if lowered.startswith("heading"):
        level = "".join(ch for ch in style if ch.isdigit()) or "1"
        return f"{'#' * min(6, int(level))} {text}"
    if lowered == "title":
        return f"# {text}"
    return text
