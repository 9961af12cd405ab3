"""An answer's lifecycle (``conversations.chat.lifecycle``): its moves, the status each end
stores, and orphans shown by a read that writes nothing, then stored by the lifecycle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from conversations.chat import lifecycle
from conversations.chat.queries import load_thread
from conversations.chat.records import Answer, Phase, StopReason, ToolRun
from conversations.cluster import registry as cluster
from conversations.models import Message


def answer(**fields) -> Answer:
    node = Answer(message_id=1, conversation_id=2, owner_id=3, request_id="r")
    for name, value in fields.items():
        setattr(node, name, value)
    return node


def test_a_node_moves_forward_only_and_never_after_its_end() -> None:
    node = answer()
    lifecycle.advance(node, Phase.STREAMING)
    lifecycle.advance(node, Phase.FINISHED)
    with pytest.raises(lifecycle.InvalidMove):
        lifecycle.advance(node, Phase.STREAMING)
    run = ToolRun(message_id=4, conversation_id=2, owner_id=3, request_id="t")
    lifecycle.start_tool_step(run)
    assert run.phase is Phase.TOOL_STEP
    lifecycle.advance(run, Phase.FENCED)  # a fence can come at any time
    with pytest.raises(lifecycle.InvalidMove):
        lifecycle.advance(answer(), Phase.QUEUED)


def test_each_end_of_an_answer_has_its_status_and_finish_reason() -> None:
    interrupted, complete = Message.Status.INTERRUPTED, Message.Status.COMPLETE
    assert lifecycle.answer_status(answer(finish_reason="stop"), "") == (complete, "stop")
    assert lifecycle.answer_status(answer(finish_reason="length"), "") == (complete, "length")
    assert lifecycle.answer_status(answer(finish_reason="stop"), "it broke") == (
        Message.Status.ERROR,
        "error",
    )
    assert lifecycle.answer_status(answer(), "") == (interrupted, "abort")  # the engine never finished it
    stopped = answer(finish_reason="stop", stop_reason=StopReason.USER)
    assert lifecycle.answer_status(stopped, "") == (interrupted, "stop")
    assert lifecycle.queued_fields("p1") == {"status": Message.Status.STREAMING, "owner_process": "p1"}


@pytest.mark.django_db(transaction=True)
async def test_a_read_shows_an_orphan_interrupted_and_writes_nothing_until_the_lifecycle_does(
    make_user, make_conversation
):
    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(alice)
    question = await Message.objects.acreate(conversation=conversation, role="user", content="Hi")

    async def streaming(content: str, owner: str) -> Message:
        fields = {"status": Message.Status.STREAMING, "owner_process": owner}
        return await Message.objects.acreate(
            conversation=conversation, parent=question, role="assistant", content=content, **fields
        )

    left = await streaming("half an ans", "a-process-that-died")
    alive = await streaming("still going", cluster.PROCESS_ID)
    await Message.objects.filter(pk=alive.pk).aupdate(updated_at=timezone.now() - timedelta(seconds=5))
    one_process = cluster.Liveness({cluster.PROCESS_ID})  # every other owner is a previous run: dead

    read = await load_thread(conversation, set(), one_process)
    assert read.orphans == [left.pk]
    shown = {m["id"]: m for m in read.thread["messages"]}
    if left.pk in shown:  # the thread shows the latest branch; the other is a sibling
        assert (shown[left.pk]["status"], shown[left.pk]["finish_reason"]) == ("interrupted", "abort")
    assert (await Message.objects.aget(pk=left.pk)).status == Message.Status.STREAMING  # nothing written

    assert await lifecycle.settle_orphans(read.orphans) == 1
    stored = await Message.objects.aget(pk=left.pk)
    assert (stored.status, stored.finish_reason, stored.content) == ("interrupted", "abort", "half an ans")
    assert (await Message.objects.aget(pk=alive.pk)).status == Message.Status.STREAMING
    assert (await load_thread(conversation, set(), one_process)).orphans == []
