"""Fork ("Continue in a new conversation"): the path copied, the new conversation's first
answer served from the prefix cache, and other users' messages refused."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from conversations.chat import tree as tree_ops
from conversations.chat.fork import fork_at
from conversations.chat.tree import Tree, TreeError
from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine
from tests.chat.conftest import Socket


@pytest.mark.django_db
def test_fork_copies_the_path_to_a_message_into_a_new_conversation(branchy, alice):
    thread = Tree.load(branchy).thread()  # Q1, A1, Q2, A2 (error)
    Message.objects.filter(pk=thread[1].pk).update(token_ids=[1, 2, 3])
    forked = fork_at(alice, thread[2].pk)

    assert forked.pk != branchy.pk and forked.owner == alice
    assert (forked.title, forked.system_prompt, forked.top_k) == ("Trip", "Be brief.", 40)
    copy = Tree.load(forked)
    assert [m.content for m in copy.thread()] == [m.content for m in thread[:3]]
    assert len(copy.by_id) == 3  # only the path: no sibling branches
    assert Message.objects.get(conversation=forked, role="assistant").token_ids == [1, 2, 3]
    assert Message.objects.filter(conversation=branchy).count() == 7  # the original is untouched


@pytest.mark.django_db
def test_fork_refuses_another_users_message_and_a_streaming_one(branchy, bob, alice):
    message = Tree.load(branchy).thread()[0]
    with pytest.raises(TreeError, match="no message"):
        fork_at(bob, message.pk)
    with pytest.raises(TreeError, match="no message"):
        fork_at(alice, "not-a-number")
    _, streaming = tree_ops.send_message(branchy, "still going")
    with pytest.raises(TreeError, match="still being written"):
        fork_at(alice, streaming.pk)
    assert Conversation.objects.filter(owner=bob).count() == 0


@database_sync_to_async  # closes its connection after: the test database can be dropped
def count_conversations(user) -> int:
    return Conversation.objects.filter(owner=user).count()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine")
async def test_the_forked_conversations_first_answer_hits_the_prefix_cache(quick_user, settings):
    settings.TITLES_FROM_MODEL = False
    alice = await sync_to_async(quick_user)("alice")
    bob = await sync_to_async(quick_user)("bob")
    original = await Conversation.objects.acreate(
        owner=alice, system_prompt="You are terse.", temperature=0.0, max_tokens=24
    )
    socket = await Socket.open(alice)
    await socket.send(type="open", conversation_id=original.pk)
    await socket.until("thread")
    await socket.send(type="send", conversation_id=original.pk, content="Hello there, how are you today?")
    first, _ = await socket.finished()

    await socket.send(type="fork", message_id=first["id"])
    forked, _ = await socket.until("forked")
    await socket.until("conversations")  # the sidebar reloads
    new_id = forked["conversation_id"]
    assert new_id != original.pk

    engine = await aget_engine()
    hits_before = engine.stats().prefix_hit_tokens
    await socket.send(type="open", conversation_id=new_id)
    thread, _ = await socket.until("thread")
    assert [m["content"] for m in thread["messages"]] == ["Hello there, how are you today?", first["content"]]
    await socket.send(type="send", conversation_id=new_id, content="And tomorrow?")
    second, _ = await socket.finished()
    hits = engine.stats().prefix_hit_tokens - hits_before
    assert second["cached_tokens"] >= 16 and hits >= 16  # at least one full KV block of the copied turns

    # Another user's message: an error on a socket that stays open, and nothing is created.
    other = await Socket.open(bob)
    await other.send(type="fork", message_id=first["id"])
    error, _ = await other.until("error")
    assert "no message" in error["detail"]
    await other.send(type="ping")
    await other.until("pong")
    assert await count_conversations(bob) == 0
    await other.close()
    await socket.close()
