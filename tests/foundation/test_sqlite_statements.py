"""SQLite placeholders rewritten once per statement text: the same text as Django's rewrite
(literal ``%%`` and ``%%s`` included), named parameters left to Django, and a bounded store."""

from __future__ import annotations

import pytest

from chatsite import sqlite_statements

STATEMENTS = [
    'SELECT "id" FROM "t" WHERE "a" = %s AND "b" IN (%s, %s)',
    "SELECT '100%%' WHERE x LIKE %s ESCAPE '\\'",
    "SELECT '%%s literal', %s",
    "UPDATE t SET a = 1",
]


@pytest.mark.parametrize("query", STATEMENTS)
def test_the_kept_rewrite_is_djangos(query):
    expected = sqlite_statements._django_convert(None, query)
    assert sqlite_statements.convert_query(None, query) == expected
    assert sqlite_statements.convert_query(None, query) == expected  # from the store
    assert sqlite_statements._converted[query] == expected


def test_named_parameters_keep_djangos_rewrite():
    query = "SELECT %(a)s, %(b)s"
    assert sqlite_statements.convert_query(None, query, param_names=["a", "b"]) == "SELECT :a, :b"
    assert query not in sqlite_statements._converted


def test_the_store_is_forgotten_once_full(monkeypatch):
    monkeypatch.setattr(sqlite_statements, "KEPT", 3)
    monkeypatch.setattr(sqlite_statements, "_converted", {})
    for i in range(3):
        sqlite_statements.convert_query(None, f"SELECT {i}, %s")
    assert len(sqlite_statements._converted) == 3
    sqlite_statements.convert_query(None, "SELECT 3, %s")
    assert sqlite_statements._converted == {"SELECT 3, %s": "SELECT 3, ?"}


def test_installed_django_statements_run_as_before(monkeypatch):
    """Django's SQLite cursor on a database of its own (whatever the suite's database is)."""
    import sqlite3

    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    monkeypatch.setattr(SQLiteCursorWrapper, "convert_query", sqlite_statements.convert_query)
    connection = sqlite3.connect(":memory:")
    try:
        cursor = connection.cursor(factory=SQLiteCursorWrapper)
        for _ in range(2):  # rewritten, then from the store
            cursor.execute("SELECT %s || '%%', %s", ["50", 2])
            assert cursor.fetchone() == ("50%", 2)
    finally:
        connection.close()
