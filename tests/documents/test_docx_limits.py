"""A DOCX whose document.xml is a bomb inside the archive's overall ratio (padded with an
incompressible member) is refused quickly, with a clear error and bounded memory: by its
declared size, or, under that, by its element count while it is read as a stream."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conversations.documents.extract import DOCX_MAX_RATIO
from tests.documents.conftest import make_docx

ROOT = Path(__file__).resolve().parents[2]
HEAD = (
    b'<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
    b'wordprocessingml/2006/main"><w:body>'
)


def padded_bomb(xml_bytes: int) -> bytes:
    """``xml_bytes`` of empty paragraphs, with random bytes stored beside them so the archive
    as a whole stays under the inflation ratio the ZIP check refuses."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as member:
            member.write(HEAD)
            chunk = b"<w:p/>" * 100_000
            for _ in range(xml_bytes // len(chunk)):
                member.write(chunk)
            member.write(b"</w:body></w:document>")
        pad = os.urandom(xml_bytes // (DOCX_MAX_RATIO - 40))
        archive.writestr("word/media/pad.bin", pad, compress_type=zipfile.ZIP_STORED)
    return out.getvalue()


# Reads the file in a process of its own, which reports the error and its peak memory.
READER = """
import json, resource, sys
from conversations.documents.extract import extract
from conversations.documents.formats import DocumentError
data = open(sys.argv[1], "rb").read()
before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the imports' own peak
try:
    extract("padded.docx", "docx", data, max_pages=10)
    error = None
except DocumentError as exc:
    error = str(exc)
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"error": error, "peak_mb": peak_mb, "grew_mb": peak_mb - before_mb}))
"""


def read_in_a_process(data: bytes, tmp_path: Path) -> dict:
    path = tmp_path / "padded.docx"
    path.write_bytes(data)
    # A cap on the address space as well: a whole-tree parse fails here rather than take the machine.
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
    done = subprocess.run(
        [sys.executable, "-c", limit + READER, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("xml_bytes", "says"),
    [
        (151_000_000, "would inflate to 150,600,134 bytes; at most"),  # the probe's size
        (30_000_000, "holds more than 1,000,000 XML elements"),  # under the size cap: the count stops it
    ],
)
def test_a_padded_bomb_is_refused_with_bounded_memory(xml_bytes, says, tmp_path):
    data = padded_bomb(xml_bytes)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        total = sum(e.file_size for e in archive.infolist())
    assert total < DOCX_MAX_RATIO * len(data)  # inside the ratio the ZIP check enforces
    report = read_in_a_process(data, tmp_path)
    assert report["error"] is not None and says in report["error"], report
    assert "padded.docx" in report["error"]
    assert report["grew_mb"] < 400, report  # the file streamed, not built into a tree


def test_streamed_docx_keeps_headings_tables_and_breaks():
    import docx

    from conversations.documents.extract import extract

    document = docx.Document()
    document.add_paragraph("Report", style="Title")
    document.add_paragraph("Intro", style="Heading 1")
    paragraph = document.add_paragraph("one")
    paragraph.add_run().add_tab()
    paragraph.add_run("two")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate(table.rows):
        for c, cell in enumerate(row.cells):
            cell.text = f"r{r}c{c}"
    document.add_paragraph("Details", style="Heading 3")
    out = io.BytesIO()
    document.save(out)
    text = extract("r.docx", "docx", out.getvalue(), max_pages=10).text
    assert text == "# Report\n\n# Intro\n\none\ttwo\n\n### Details\n\nr0c0 | r0c1\n\nr1c0 | r1c1"
    assert extract("m.docx", "docx", make_docx([("a", None)]), max_pages=1).text == "a"
