"""The history behind a prompt: read newest first only as far as the context reaches, built
off Channels' shared database thread, and stored token ids reused only under the tokenizer
that made them."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from conversations.chat import prompt_history, prompts
from conversations.chat.answer_rows import store_user_segment
from conversations.chat.fork import fork_at
from conversations.chat.prompt_history import answer_prompt, plan_prompt, read_history, thread_prompt
from conversations.chat.prompts import build_prompt
from conversations.chat.retention import retention_key
from conversations.chat.token_fingerprint import token_fingerprint
from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine
from tests.chat.conftest import Socket

OTHER = "another-model#0123456789abcdef"
OUT_OF_VOCAB = [10_000_000 + i for i in range(6)]


def make_thread(conversation, turns: int, tokenizer, fingerprint: str) -> list[Message]:
    """A thread of ``turns`` question/answer pairs with stored ids, in two bulk queries."""
    rows = []
    for i in range(turns):
        question = f"Question {i}: how do lighthouses work at night?"
        answer = f"Answer {i}: a lamp and a lens, turning."
        for role, text, ids in (
            ("user", question, tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n")),
            ("assistant", answer, tokenizer.encode(answer) + tokenizer.eos_token_ids[:1]),
        ):
            rows.append(
                Message(
                    conversation=conversation,
                    role=role,
                    content=text,
                    token_ids=ids,
                    token_fingerprint=fingerprint,
                )
            )
    rows = Message.objects.bulk_create(rows)
    for parent, child in zip(rows, rows[1:], strict=False):
        child.parent_id = parent.pk
    Message.objects.bulk_update(rows, ["parent"], batch_size=500)
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf_id=rows[-1].pk)
    conversation.current_leaf_id = rows[-1].pk
    return rows


def engine_like(tokenizer, max_model_len: int):
    return SimpleNamespace(tokenizer=tokenizer, max_model_len=max_model_len, model_name="tiny")


@pytest.mark.django_db
def test_a_long_threads_history_is_read_only_as_far_back_as_the_context_reaches(
    make_user, make_conversation, tokenizer
):
    conversation = make_conversation(make_user(), system_prompt="Be brief.", max_tokens=64)
    fingerprint = token_fingerprint("tiny", tokenizer)
    rows = make_thread(conversation, 600, tokenizer, fingerprint)
    leaf = rows[-1].pk
    near = read_history(conversation.pk, leaf, fingerprint=fingerprint, reach=1024)
    assert 0 < near.earlier and len(near.messages) < 600  # pages, not the whole thread
    assert near.messages[0]["role"] == "user" and near.messages[-1]["id"] == leaf
    assert near.earlier + len(near.messages) == 1200
    everything = read_history(conversation.pk, leaf, fingerprint=fingerprint, reach=10**9)
    assert everything.earlier == 0 and [m["id"] for m in everything.messages] == [r.pk for r in rows]
    assert [m["id"] for m in near.messages] == [r.pk for r in rows[near.earlier :]]
    expected = build_prompt(tokenizer, "Be brief.", everything.messages, 1024, 64)
    plan = build_prompt(tokenizer, "Be brief.", near.messages, 1024, 64, earlier=near.earlier)
    assert (plan.token_ids, plan.dropped) == (expected.token_ids, expected.dropped)
    assert plan.dropped > 1000


@pytest.mark.django_db
def test_ids_stored_under_another_fingerprint_are_read_as_absent(make_user, make_conversation, tokenizer):
    conversation = make_conversation(make_user())
    fingerprint = token_fingerprint("tiny", tokenizer)
    rows = make_thread(conversation, 3, tokenizer, fingerprint)
    Message.objects.filter(pk=rows[0].pk).update(token_fingerprint=OTHER)
    Message.objects.filter(pk=rows[1].pk).update(token_fingerprint="")  # stored before fingerprints
    history = read_history(conversation.pk, rows[-1].pk, fingerprint=fingerprint, reach=10**6).messages
    assert [m["token_ids"] is None for m in history] == [True, True, False, False, False, False]


@pytest.mark.django_db
def test_a_fork_keeps_each_messages_ids_with_their_fingerprint(make_user, make_conversation, tokenizer):
    owner = make_user()
    conversation = make_conversation(owner)
    rows = make_thread(conversation, 2, tokenizer, "tiny#00")
    copy = fork_at(owner, rows[-1].pk)
    copied = list(Message.objects.filter(conversation=copy).order_by("id"))
    assert [(m.token_ids, m.token_fingerprint) for m in copied] == [(r.token_ids, "tiny#00") for r in rows]


@pytest.mark.django_db(transaction=True)
async def test_out_of_vocabulary_ids_of_another_tokenizer_never_reach_the_prompt(
    make_user, make_conversation, tokenizer
):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, system_prompt="S.")
    rows = await sync_to_async(make_thread)(conversation, 4, tokenizer, OTHER)
    await Message.objects.filter(pk=rows[1].pk).aupdate(token_ids=OUT_OF_VOCAB)
    engine = engine_like(tokenizer, 4096)
    plan = (await plan_prompt(conversation, rows[-1].pk, engine)).plan
    assert not set(OUT_OF_VOCAB) & set(plan.token_ids)
    assert max(plan.token_ids) < tokenizer.vocab_size
    # The same ids under this tokenizer's own fingerprint are trusted and reused verbatim.
    mine = token_fingerprint("tiny", tokenizer)
    await Message.objects.filter(pk__in=[r.pk for r in rows]).aupdate(token_fingerprint=mine)
    plan = (await plan_prompt(conversation, rows[-1].pk, engine)).plan
    assert set(OUT_OF_VOCAB) <= set(plan.token_ids)


@pytest.mark.django_db(transaction=True)
async def test_a_user_segment_is_stored_again_only_when_its_ids_came_from_another_tokenizer(
    make_user, make_conversation
):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user)
    question = await Message.objects.acreate(
        conversation=conversation, role="user", content="Hi", token_ids=[1, 2], token_fingerprint=OTHER
    )
    await store_user_segment(question.pk, [7, 8, 9], "mine#1")
    await question.arefresh_from_db()
    assert (question.token_ids, question.token_fingerprint) == ([7, 8, 9], "mine#1")
    await store_user_segment(question.pk, [4], "mine#1")
    await question.arefresh_from_db()
    assert question.token_ids == [7, 8, 9]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine")
async def test_an_answer_after_another_tokenizers_ids_is_built_from_text_and_stores_its_own(
    make_user, make_conversation, tokenizer
):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, temperature=0.0, max_tokens=8)
    rows = await sync_to_async(make_thread)(conversation, 3, tokenizer, OTHER)
    for row in rows:  # ids that would fail the model's embedding if they were reused
        await Message.objects.filter(pk=row.pk).aupdate(token_ids=OUT_OF_VOCAB)
    engine = await aget_engine()
    socket = await Socket.open(user)
    answer = await socket.open_and_ask(conversation.pk, "And in fog?")
    await socket.close()
    assert answer["status"] == "complete", answer["error"]
    saved = await Message.objects.aget(pk=answer["id"])
    question = await Message.objects.aget(pk=saved.parent_id)
    fingerprint = token_fingerprint(engine.model_name, engine.tokenizer)
    assert saved.token_ids and saved.token_fingerprint == fingerprint
    assert question.token_ids and question.token_fingerprint == fingerprint
    assert saved.prompt_tokens > 6 * len("Question 0: how do lighthouses work at night?".split())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine")
async def test_prompts_are_built_off_the_shared_database_thread(make_user, make_conversation, monkeypatch):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, temperature=0.0, max_tokens=8)
    engine = await aget_engine()  # loaded, so opening the tab marks the history for retention
    threads: list[int] = []
    real = prompts.encode_segments

    def recording(*args, **kwargs):
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(prompts, "encode_segments", recording)
    database_thread = await database_sync_to_async(threading.get_ident)()
    socket = await Socket.open(user)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")
    await socket.send(type="send", conversation_id=conversation.pk, content="Tell me about fog horns.")
    thread, _ = await socket.until("thread")
    answer, _ = await socket.finished(thread["messages"][-1]["id"])
    await socket.close()
    key = retention_key(conversation.pk)
    retained = engine.engine.block_manager.retention.keys()
    for _ in range(200):  # the last tab left: the mark goes
        if key not in retained:
            break
        await asyncio.sleep(0.05)
    reopened = await Socket.open(user)  # a tab showing the history renders it for retention
    await reopened.send(type="open", conversation_id=conversation.pk)
    await reopened.until("thread")
    for _ in range(200):
        if key in retained:
            break
        await asyncio.sleep(0.05)
    await reopened.close()
    assert answer["status"] == "complete"
    assert len(threads) >= 2  # the answer's prompt and the retained history
    assert database_thread not in threads
    assert (await answer_prompt(answer["id"], engine)).plan.token_ids  # the answer's prompt rebuilds


def ask(conversation, parent_id: int, text: str) -> Message:
    """A question under ``parent_id`` and its streaming answer (returned), as a send makes."""
    question = Message.objects.create(
        conversation=conversation, parent_id=parent_id, role="user", content=text
    )
    answer = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", status=Message.Status.STREAMING
    )
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=answer)
    return answer


def finish(answer: Message, text: str, tokenizer, fingerprint: str) -> None:
    ids = tokenizer.encode(text) + tokenizer.eos_token_ids[:1]
    Message.objects.filter(pk=answer.pk).update(
        content=text, token_ids=ids, token_fingerprint=fingerprint, status=Message.Status.COMPLETE
    )


@pytest.mark.django_db(transaction=True)
async def test_the_answer_path_keeps_where_the_prompt_starts_and_the_retention_only_reads_it(
    make_user, make_conversation, tokenizer, monkeypatch
):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, system_prompt="Be brief.", max_tokens=64)
    fingerprint = token_fingerprint("tiny", tokenizer)
    rows = await sync_to_async(make_thread)(conversation, 200, tokenizer, fingerprint)
    engine = engine_like(tokenizer, 1024)
    looked = await thread_prompt(conversation.pk, engine)  # the retention's look writes nothing
    assert looked.plan.start_id is not None
    assert (await Conversation.objects.aget(pk=conversation.pk)).context_start_id is None
    answer = await sync_to_async(ask)(conversation, rows[-1].pk, "And at night?")
    first = (await answer_prompt(answer.pk, engine)).plan
    stored = (await Conversation.objects.aget(pk=conversation.pk)).context_start_id
    assert stored == first.start_id and (await Message.objects.aget(pk=stored)).role == "user"
    # The next turn starts at the same message: the previous prompt and answer are its prefix.
    await sync_to_async(finish)(answer, "A lamp, turning.", tokenizer, fingerprint)
    following = await sync_to_async(ask)(conversation, answer.pk, "And in fog?")
    second = (await answer_prompt(following.pk, engine)).plan
    assert second.start_id == stored and second.token_ids[: len(first.token_ids)] == first.token_ids
    looked = await thread_prompt(conversation.pk, engine)  # reads the kept start
    assert looked.plan.dropped == second.dropped
    # A read whose guess stops short of the stored start goes on back to it.
    monkeypatch.setattr(prompt_history, "PAGE", 8)
    read = database_sync_to_async(read_history)
    short = await read(conversation.pk, following.parent_id, fingerprint=fingerprint, reach=300)
    assert stored not in [m["id"] for m in short.messages]
    near = await read(
        conversation.pk, following.parent_id, fingerprint=fingerprint, reach=300, start_id=stored
    )
    assert stored in [m["id"] for m in near.messages]


@pytest.mark.django_db(transaction=True)
async def test_a_branch_away_from_the_stored_start_gets_a_new_cut_and_keeps_it(
    make_user, make_conversation, tokenizer
):
    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, system_prompt="Be brief.", max_tokens=64)
    fingerprint = token_fingerprint("tiny", tokenizer)
    rows = await sync_to_async(make_thread)(conversation, 200, tokenizer, fingerprint)
    engine = engine_like(tokenizer, 1024)
    answer = await sync_to_async(ask)(conversation, rows[-1].pk, "And at night?")
    stored = (await answer_prompt(answer.pk, engine)).plan.start_id
    # An edited question well after the start: the start stays on the path and is kept.
    edit = await sync_to_async(ask)(conversation, rows[-3].pk, "Edited: and at dusk?")
    assert (await answer_prompt(edit.pk, engine)).plan.start_id == stored
    # An edit before the start: a path without it, cut afresh (as without a stored start).
    branch = await sync_to_async(ask)(conversation, rows[-301].pk, "Edited long ago?")
    plan = (await answer_prompt(branch.pk, engine)).plan
    fresh = (await plan_prompt(conversation, branch.parent_id, engine)).plan
    assert plan.start_id != stored and plan.token_ids == fresh.token_ids
    assert (await Conversation.objects.aget(pk=conversation.pk)).context_start_id == plan.start_id


@pytest.mark.django_db(transaction=True)
async def test_an_answers_inputs_read_where_it_was_created_make_the_same_prompt_as_a_fresh_read(
    make_user, make_conversation, tokenizer, monkeypatch
):
    from conversations.chat import tree as tree_ops

    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, system_prompt="Be brief.", max_tokens=64)
    fingerprint = token_fingerprint("tiny", tokenizer)
    await sync_to_async(make_thread)(conversation, 40, tokenizer, fingerprint)
    engine = engine_like(tokenizer, 1024)

    def create():
        tree, answer = tree_ops.send_message(conversation, "And in fog?")
        return answer, prompt_history.answer_inputs_from_tree(tree, answer.pk, engine)

    answer, inputs = await sync_to_async(create)()
    assert inputs is not None and inputs.first.history.messages[-1]["content"] == "And in fog?"
    read = (await answer_prompt(answer.pk, engine)).plan

    async def no_second_read(*args):
        raise AssertionError("the answer's inputs were read again")

    monkeypatch.setattr(prompt_history, "_answer_inputs", no_second_read)
    prefetched = (await answer_prompt(answer.pk, engine, inputs=inputs)).plan
    assert prefetched.token_ids == read.token_ids and prefetched.start_id == read.start_id
    assert prefetched.dropped == read.dropped > 0  # 40 turns do not fit: the cut is the same too
    # Made for another engine (another context length), they are read again.
    other = engine_like(tokenizer, 2048)
    with pytest.raises(AssertionError, match="read again"):
        await answer_prompt(answer.pk, other, inputs=inputs)


@pytest.mark.django_db(transaction=True)
async def test_a_question_written_where_its_answer_was_created_is_not_read_back(
    make_user, make_conversation, tokenizer, monkeypatch
):
    from conversations.chat import tree as tree_ops

    user = await sync_to_async(make_user)()
    conversation = await sync_to_async(make_conversation)(user, max_tokens=64)
    engine = engine_like(tokenizer, 1024)
    token_fingerprint("tiny", tokenizer)  # known: the inputs are read at creation
    read_ids: list[list[int]] = []
    real_rows = prompt_history._rows
    monkeypatch.setattr(prompt_history, "_rows", lambda ids: read_ids.append(ids) or real_rows(ids))

    def create(text: str):
        tree, answer = tree_ops.send_message(conversation, text)
        return answer, prompt_history.answer_inputs_from_tree(tree, answer.pk, engine)

    answer, inputs = await sync_to_async(create)("How do lighthouses work?")
    assert read_ids == []  # the question was written by this call: nothing to read
    fresh = await database_sync_to_async(read_history)(
        conversation.pk, answer.parent_id, fingerprint=inputs.fingerprint, reach=inputs.first.reach
    )
    assert inputs.first.history == fresh
    # The next question's history holds the earlier turn: that one is read, the new one is not.
    await sync_to_async(Message.objects.filter(pk=answer.pk).update)(content="A lamp.", status="complete")
    read_ids.clear()
    second, inputs = await sync_to_async(create)("And in fog?")
    assert read_ids == [[answer.parent_id, answer.pk]]
    fresh = await database_sync_to_async(read_history)(
        conversation.pk, second.parent_id, fingerprint=inputs.fingerprint, reach=inputs.first.reach
    )
    assert inputs.first.history == fresh
