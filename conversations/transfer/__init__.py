"""Conversations to and from files: our JSON (the whole tree), Markdown (the shown thread),
and ChatGPT's ``conversations.json``. Plain functions; the Celery tasks, the data page and
the management commands call them."""

from conversations.transfer.exporting import export_json, export_markdown, render_json
from conversations.transfer.importing import ImportResult, import_bytes, parse_file
from conversations.transfer.validate import InvalidFile

__all__ = [
    "ImportResult",
    "InvalidFile",
    "export_json",
    "export_markdown",
    "import_bytes",
    "parse_file",
    "render_json",
]
