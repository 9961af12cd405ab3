"""``db_call``: the thread Channels' ``database_sync_to_async`` uses, stale connections
closed around each call, the caller's context variables visible, errors raised to the
caller; asgiref's own hop wherever asgiref would pick another thread."""

from __future__ import annotations

import contextvars
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from conversations.ops import db_thread
from conversations.ops.db_thread import db_call

caller_var: contextvars.ContextVar[str] = contextvars.ContextVar("caller_var", default="unset")


@pytest.fixture(autouse=True)
def closes(monkeypatch) -> list[str]:
    """The connection checks each hop makes, recorded instead of made (no database here)."""
    made: list[str] = []
    monkeypatch.setattr(db_thread, "close_old_connections", lambda: made.append("close"))
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)
    return made


def where() -> tuple[int, str]:
    return threading.get_ident(), caller_var.get()


async def test_a_call_runs_on_the_database_thread_and_sees_the_callers_context(closes):
    caller_var.set("the caller's")
    ours = await db_call(where)()
    channels_thread, _ = await database_sync_to_async(where)()
    assert ours == (channels_thread, "the caller's")
    assert ours[0] != threading.get_ident()
    assert closes == ["close", "close"]


async def test_errors_reach_the_caller_and_connections_are_still_closed(closes):

    def fails(word: str, *, times: int) -> None:
        raise LookupError(word * times)

    with pytest.raises(LookupError, match="nono"):
        await db_call(fails)("no", times=2)
    assert closes == ["close", "close"]


def test_under_async_to_sync_the_call_runs_where_asgiref_runs_it():
    async def both() -> tuple[tuple[int, str], tuple[int, str]]:
        return await db_call(where)(), await database_sync_to_async(where)()

    ours, asgirefs = async_to_sync(both)()
    assert ours == asgirefs and ours[0] == threading.get_ident()  # the sync caller's thread
