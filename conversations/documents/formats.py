"""Which files are taken, and how each kind is told apart.

The kind comes from the file name's extension; its bytes must then agree (a "text" file
holding NUL bytes or invalid UTF-8 is binary, a ".pdf" must start like a PDF, a ".docx"
must be a ZIP). Anything else is refused with a one-line reason naming the file.
"""

from __future__ import annotations

from pathlib import PurePath


class DocumentError(ValueError):
    """A file that cannot be taken or read; the message is shown to its uploader."""


TEXT_EXTENSIONS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown"}
HTML_EXTENSIONS = {".html", ".htm", ".xhtml"}
CODE_EXTENSIONS = {
    ".py", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".java", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs",
    ".go", ".rs", ".rb", ".php", ".swift", ".kt", ".scala", ".sh", ".bash", ".sql", ".r", ".lua",
    ".pl", ".hs", ".ml", ".css", ".scss", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".xml",
    ".csv", ".tsv", ".rst", ".tex", ".m", ".jl", ".dart", ".vue", ".svelte", ".zig", ".nim",
}  # fmt: skip
CODE_NAMES = {"makefile", "dockerfile", "readme", "license", "procfile"}
ACCEPT = sorted({".pdf", ".docx", *TEXT_EXTENSIONS, *HTML_EXTENSIONS, *CODE_EXTENSIONS})


def kind_of(filename: str) -> str:
    """pdf | docx | text | markdown | html | code, from the name; else ``DocumentError``."""
    path = PurePath(filename)
    ext = path.suffix.lower()
    if ext == ".pdf":
        return "pdf"
    if ext == ".docx":
        return "docx"
    if ext in TEXT_EXTENSIONS:
        return TEXT_EXTENSIONS[ext]
    if ext in HTML_EXTENSIONS:
        return "html"
    if ext in CODE_EXTENSIONS or path.name.lower() in CODE_NAMES:
        return "code"
    shown = ext or "no extension"
    raise DocumentError(
        f"{filename}: files of this type ({shown}) are not supported; "
        "upload PDF, DOCX, text, Markdown, HTML or source code."
    )


def decode_text(filename: str, data: bytes) -> str:
    """UTF-8 text (a BOM dropped); a NUL byte or invalid UTF-8 means a binary file."""
    if b"\x00" in data[:65536]:
        raise DocumentError(f"{filename} looks like a binary file, not text.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{filename} is not UTF-8 text (byte {exc.start} cannot be read).") from exc


def check_signature(filename: str, kind: str, data: bytes) -> None:
    if not data:
        raise DocumentError(f"{filename} is empty.")
    if kind == "pdf" and not data[:1024].lstrip().startswith(b"%PDF-"):
        raise DocumentError(f"{filename} is not a PDF file (it does not start with %PDF-).")
    if kind == "docx" and not data.startswith(b"PK"):
        raise DocumentError(f"{filename} is not a DOCX file (a DOCX is a ZIP archive).")
