"""The flush after a transactional test, by DELETE rather than TRUNCATE.

Django empties the database after each transactional test with ``flush``, which on PostgreSQL
is one ``TRUNCATE`` of every table: a new file per table and a WAL flush, about 1.4 s on a busy
2-core machine, where a ``DELETE`` of the few rows a test leaves takes about 0.03 s. The outcome
is the same as Django's flush: every table of the site's models empty, then ``post_migrate``
(content types and permissions back) unless the test case inhibits it. Sequences go on
counting, as with Django's flush after a test (``reset_sequences=False``).

Why a patch of Django's test module: neither Django nor pytest-django offers a hook for how a
``TransactionTestCase`` empties the database; ``_fixture_teardown`` calls
``django.test.testcases.call_command("flush", ...)`` directly, so ``tests/conftest.py`` swaps that
name for the session. ``tests/foundation/test_test_flush.py`` checks the outcome equals Django's
flush (empty tables, content types and permissions back) on PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core.management.base import CommandError
from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, IntegrityError, connections, transaction


def delete_every_row(database: str) -> list[str]:
    """Every row of every model table of ``database``, deleted in one transaction (foreign keys
    are checked at its commit: Django creates them deferred). Returns the tables."""
    connection = connections[database]
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with transaction.atomic(using=database), connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
    return tables


def _register_post_migrate_handlers() -> None:
    """What ``flush`` imports first: each app's ``management`` module, where some apps connect
    their ``post_migrate`` handlers."""
    for app_config in apps.get_app_configs():
        try:
            import_module(".management", app_config.name)
        except ImportError:
            pass


def flush_by_delete(database: str, inhibit_post_migrate: bool) -> None:
    """Django's ``flush --database database`` after a test, by ``DELETE``. Database errors are
    a ``CommandError`` caused by them, as ``flush`` raises (the deadlock retry reads the cause)."""
    _register_post_migrate_handlers()
    try:
        tables = delete_every_row(database)
    except DatabaseError as exc:
        raise CommandError(f"Database {database} couldn't be flushed by DELETE.") from exc
    if tables and not inhibit_post_migrate:
        emit_post_migrate_signal(0, False, database)


def deleting_flush(call_command: Callable[..., Any]) -> Callable[..., Any]:
    """``call_command`` with the flush of a test's teardown done by :func:`flush_by_delete`.
    Other commands, and a flush that cascades or resets sequences, go to ``call_command``; so
    does one whose DELETE a foreign key refuses (a constraint that is not deferred)."""

    def call(name: str, *args: Any, **options: Any) -> Any:
        if name != "flush" or args or options.get("allow_cascade") or options.get("reset_sequences", True):
            return call_command(name, *args, **options)
        try:
            return flush_by_delete(options["database"], bool(options.get("inhibit_post_migrate")))
        except CommandError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            return call_command(name, *args, **options)

    return call
