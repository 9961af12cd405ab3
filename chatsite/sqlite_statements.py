"""Django's SQLite placeholders, rewritten once per statement text.

Django's SQLite cursor turns a statement's ``%s`` placeholders into ``?`` with a regular
expression (through a lazy object) on every execution: about 10 µs for an insert into the
chat's messages table, and a chat answer runs a dozen statements on the one database thread.
The rewrite depends on the text alone, so it is kept per text seen (up to ``KEPT`` texts,
then all forgotten at once: statements built with varying ``IN`` lists must not grow it
without bound). Named (``pyformat``) parameters keep Django's rewrite.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.sqlite3.base import SQLiteCursorWrapper

KEPT = 2048
_django_convert = SQLiteCursorWrapper.convert_query
_converted: dict[str, str] = {}


def convert_query(self: Any, query: str, *, param_names: list[str] | None = None) -> str:
    if param_names is not None:
        return _django_convert(self, query, param_names=param_names)
    converted = _converted.get(query)
    if converted is None:
        converted = _django_convert(self, query)
        if len(_converted) >= KEPT:
            _converted.clear()
        _converted[query] = converted
    return converted


def install() -> None:
    SQLiteCursorWrapper.convert_query = convert_query
