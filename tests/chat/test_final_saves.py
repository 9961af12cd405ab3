"""Final saves close together go in one database call and one transaction; each answer
gets its own row count (0 when fenced) or its own error; saves asked during a write go in
the next call; a failed transaction is retried row by row."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from conversations.chat import answer_rows, final_saves
from conversations.chat.final_saves import FinalSaves
from conversations.cluster.registry import PROCESS_ID
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def calls(monkeypatch) -> list[list[int]]:
    """The message ids of each call to the database thread the saves make."""
    made: list[list[int]] = []
    save = answer_rows.save_finals

    async def counted(rows):
        made.append([message_id for message_id, _ in rows])
        return await save(rows)

    monkeypatch.setattr(final_saves, "save_finals", counted)
    return made


def streaming_answers(make_user, count: int, owner: str = PROCESS_ID) -> list[int]:
    conversation = Conversation.objects.create(owner=make_user())
    return [
        Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            owner_process=owner if i != 1 else "another-process",
        ).pk
        for i in range(count)
    ]


def final(text: str) -> dict:
    return {
        "content": text,
        "status": Message.Status.COMPLETE,
        "finish_reason": "stop",
        "completion_tokens": 2,
    }


async def test_saves_in_one_turn_go_in_one_call_and_a_fenced_row_counts_zero(make_user, calls):
    ids = await sync_to_async(streaming_answers)(make_user, 3)
    saves = FinalSaves()
    written = await asyncio.gather(*(saves.save(pk, final(f"answer {pk}")) for pk in ids))
    assert written == [1, 0, 1]  # the second row is another process's
    assert calls == [ids]
    rows = {m.pk: m async for m in Message.objects.filter(pk__in=ids)}
    assert rows[ids[0]].content == f"answer {ids[0]}" and rows[ids[0]].status == Message.Status.COMPLETE
    assert rows[ids[1]].status == Message.Status.STREAMING and rows[ids[1]].content == ""
    assert rows[ids[2]].content == f"answer {ids[2]}"


async def test_saves_asked_during_a_write_go_in_the_next_call(make_user, calls):
    ids = await sync_to_async(streaming_answers)(make_user, 4)
    saves = FinalSaves()
    first = asyncio.ensure_future(saves.save(ids[0], final("one")))
    while not calls:  # until the first write is under way
        await asyncio.sleep(0)
    assert calls == [[ids[0]]]
    later = [asyncio.ensure_future(saves.save(pk, final("later"))) for pk in (ids[2], ids[3])]
    assert await first == 1 and await asyncio.gather(*later) == [1, 1]
    assert calls == [[ids[0]], [ids[2], ids[3]]]


async def test_a_failed_transaction_is_retried_row_by_row_and_only_the_bad_row_fails(
    make_user, calls, monkeypatch
):
    ids = await sync_to_async(streaming_answers)(make_user, 3)
    owned = answer_rows._owned

    def refuses_the_last(message_id, owner, **fields):
        if message_id == ids[2]:
            raise ValueError("a value the database refuses")
        return owned(message_id, owner, **fields)

    monkeypatch.setattr(answer_rows, "_owned", refuses_the_last)
    saves = FinalSaves()
    results = await asyncio.gather(*(saves.save(pk, final("x")) for pk in ids), return_exceptions=True)
    assert results[:2] == [1, 0] and isinstance(results[2], ValueError)
    assert (await Message.objects.aget(pk=ids[0])).content == "x"
    assert len(calls) == 1
