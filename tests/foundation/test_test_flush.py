"""The test suite's own support: the database flush after a transactional test."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import IntegrityError, OperationalError
from django.test import testcases

from tests.conftest import FLUSH_ATTEMPTS
from tests.support import fast_flush
from tests.support.fast_flush import deleting_flush, flush_by_delete


def flaky_flush(failures: list[str]):
    calls: list[str] = []

    def flush(*args, **kwargs) -> None:
        calls.append(kwargs["database"])
        if failures:
            raise CommandError("the database could not be flushed") from OperationalError(failures.pop())

    return flush, calls


def test_a_flush_that_deadlocks_with_a_site_process_runs_again(monkeypatch):
    flush, calls = flaky_flush(["deadlock detected"])
    monkeypatch.setattr(testcases, "call_command", flush)
    testcases.TransactionTestCase()._fixture_teardown()
    assert calls == ["default", "default"]


@pytest.mark.parametrize("failures", [["relation does not exist"], ["deadlock detected"] * FLUSH_ATTEMPTS])
def test_other_flush_failures_and_a_lasting_deadlock_still_fail(monkeypatch, failures):
    flush, _ = flaky_flush(list(failures))
    monkeypatch.setattr(testcases, "call_command", flush)
    with pytest.raises(CommandError):
        testcases.TransactionTestCase()._fixture_teardown()


def tables_with_rows() -> dict[str, int]:
    from django.db import connection

    counts = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return {table: n for table, n in counts.items() if n}


def write_rows_in_linked_tables() -> None:
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    from conversations.models import Conversation, Message

    user = get_user_model().objects.create_user(username="flushed", password="a-long-unusual-passphrase-42")
    conversation = Conversation.objects.create(owner=user)
    question = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="hi")
    Message.objects.create(
        conversation=conversation, parent=question, role=Message.Role.ASSISTANT, content="yo"
    )
    Permission.objects.create(
        codename="made_by_a_test",
        name="made by a test",
        content_type=ContentType.objects.get_for_model(Message),
    )


@pytest.mark.django_db(transaction=True)
def test_the_deleting_flush_empties_every_table_and_brings_back_the_permissions():
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    write_rows_in_linked_tables()
    flush_by_delete("default", inhibit_post_migrate=False)
    assert set(tables_with_rows()) == {ContentType._meta.db_table, Permission._meta.db_table}
    assert Permission.objects.filter(codename="add_conversation").exists()
    assert not Permission.objects.filter(codename="made_by_a_test").exists()


@pytest.mark.django_db(transaction=True)
def test_the_deleting_flush_without_post_migrate_leaves_every_table_empty():
    write_rows_in_linked_tables()
    flush_by_delete("default", inhibit_post_migrate=True)
    assert tables_with_rows() == {}


def recording_call_command():
    calls: list[tuple[str, dict]] = []

    def call(name, *args, **options):
        calls.append((name, options))

    return call, calls


@pytest.mark.parametrize(
    "options",
    [
        {"database": "default", "allow_cascade": True, "reset_sequences": False},
        {"database": "default"},  # resets sequences, as a bare flush does
    ],
)
def test_a_flush_that_cascades_or_resets_sequences_is_django_s_own(monkeypatch, options):
    deleted: list[str] = []
    monkeypatch.setattr(fast_flush, "delete_every_row", deleted.append)
    call, calls = recording_call_command()
    deleting_flush(call)("flush", **options)
    assert calls == [("flush", options)] and deleted == []


def test_a_flush_a_foreign_key_refuses_falls_back_to_django_s_own(monkeypatch):
    def refused(database: str) -> list[str]:
        raise IntegrityError("violates foreign key constraint")

    monkeypatch.setattr(fast_flush, "delete_every_row", refused)
    call, calls = recording_call_command()
    options = {"database": "default", "reset_sequences": False, "inhibit_post_migrate": True}
    deleting_flush(call)("flush", **options)
    assert calls == [("flush", options)]


def test_a_deleting_flush_that_deadlocks_is_a_command_error_caused_by_it(monkeypatch):
    def deadlocked(database: str) -> list[str]:
        raise OperationalError("deadlock detected")

    monkeypatch.setattr(fast_flush, "delete_every_row", deadlocked)
    call, calls = recording_call_command()
    with pytest.raises(CommandError) as raised:
        deleting_flush(call)("flush", database="default", reset_sequences=False)
    assert "deadlock detected" in str(raised.value.__cause__) and calls == []
