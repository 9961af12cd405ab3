"""The test suite's own support: the database flush after a transactional test."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError
from django.db import OperationalError
from django.test import testcases

from tests.conftest import FLUSH_ATTEMPTS


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
