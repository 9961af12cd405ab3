"""/metrics in Prometheus text (staff session or bearer token), the admin's live engine
page (JSON polled by a static module, no inline script), and conversation-aware KV
retention: an open conversation's history is retained in the engine and released when
its last tab closes, and the retained ids are exactly the next turn's leading ids."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from prometheus_client.parser import text_string_to_metric_families

from conversations.chat.prompt_history import answer_prompt
from conversations.chat.prompts import cache_salt_options
from conversations.chat.retention import retention_key
from conversations.models import Message
from conversations.ops.engine_handle import aget_engine
from inference.kv.chain_hash import prefix_hashes
from inference.kv.salt import salt_hash
from tests.chat.conftest import Socket


@pytest.fixture
def staff_client(client, db):
    admin = get_user_model().objects.create_superuser(
        "root", "root@example.com", "a-long-unusual-passphrase-42"
    )
    client.force_login(admin)
    return client


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.django_db
def test_metrics_need_a_staff_session_or_the_token(client, make_user, settings):
    assert client.get("/metrics").status_code == 401
    client.force_login(make_user("alice"))
    assert client.get("/metrics").status_code == 401  # signed in, not staff
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert "chatsite_engine_loaded" in families(response.content.decode())
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


@pytest.mark.django_db
@pytest.mark.usefixtures("tiny_engine")
def test_metrics_export_the_engine_figures_per_tier(staff_client):
    from conversations.ops.engine_handle import get_engine
    from inference import SamplingParams

    engine = get_engine()

    async def one() -> None:
        async for _ in engine.stream([5, 6, 7, 8] * 10, SamplingParams(temperature=0, max_tokens=3)):
            pass

    asyncio.run(one())
    engine._stats = engine.engine.stats()  # the snapshot after the last step
    found = families(staff_client.get("/metrics").content.decode())
    outcomes = {
        s.labels["outcome"]: s.value
        for s in found["chatsite_engine_requests"].samples
        if s.name.endswith("_total")
    }
    assert outcomes["length"] >= 1 and set(outcomes) == {"stop", "length", "abort", "error", "rejected"}
    ttft = found["chatsite_engine_time_to_first_token_seconds"]
    assert any(s.name.endswith("_count") and s.value >= 1 for s in ttft.samples)
    assert "chatsite_engine_time_per_output_token_seconds" in found
    kinds = {s.labels["kind"] for s in found["chatsite_engine_tokens"].samples}
    assert kinds == {"prompt", "cached", "generated"}
    states = {s.labels["state"] for s in found["chatsite_engine_requests_in_state"].samples}
    assert states == {"running", "waiting", "loading"}
    blocks = {(s.labels["tier"], s.labels["state"]) for s in found["chatsite_engine_kv_blocks"].samples}
    assert {("pool", "used"), ("pool", "cached"), ("pool", "free")} <= blocks
    for name in ("preemptions", "swaps", "aborts", "kv_prefix_hit_tokens", "kv_bytes", "kv_retained_keys"):
        assert f"chatsite_engine_{name}" in found


@pytest.mark.django_db
@pytest.mark.usefixtures("tiny_engine")
def test_the_engine_page_updates_in_place_from_a_static_module(staff_client):
    from conversations.ops.engine_handle import get_engine

    get_engine()
    page = staff_client.get("/admin/conversations/enginestatus/").content.decode()
    assert 'type="module"' in page and "js/engine_status.js" in page
    assert 'http-equiv="refresh"' not in page and "<script>" not in page  # no reload, no inline script
    assert (
        'data-plot="tokens_per_s"' in page and 'data-plot="kv_use"' in page and 'data-plot="hit_rate"' in page
    )
    live = staff_client.get("/admin/conversations/enginestatus/live/").json()
    assert live["state"] == "ready" and "pool" in live["tiers"]
    assert {"tokens_per_s", "hit_rate", "queried_tokens", "hit_tokens"} <= set(live)
    assert 0 <= live["tiers"]["pool"]["use"] <= 1


@pytest.mark.django_db
def test_the_live_figures_need_staff(client, make_user):
    client.force_login(make_user("bob"))
    assert client.get("/admin/conversations/enginestatus/live/").status_code in (302, 403)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine")
async def test_an_open_conversation_is_retained_until_its_last_tab_closes(
    make_user, make_conversation, monkeypatch
):
    from conversations.chat import retention

    reads = []
    read_history = retention.history_token_ids

    async def counted(conversation_id, engine):
        reads.append(conversation_id)
        return await read_history(conversation_id, engine)

    monkeypatch.setattr(retention, "history_token_ids", counted)
    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(alice, temperature=0.0, max_tokens=12)
    engine = await aget_engine()
    bm = engine.engine.block_manager
    key = retention_key(conversation.pk)

    async def until(condition) -> None:
        for _ in range(200):
            if condition():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("retention did not change")

    first = await Socket.open(alice)
    await first.send(type="open", conversation_id=conversation.pk)
    await first.until("thread")
    await first.send(
        type="send", conversation_id=conversation.pk, content="Tell me about lighthouses, please."
    )
    thread, _ = await first.until("thread")
    await first.finished(thread["messages"][-1]["id"])
    await until(lambda: key in bm.retention.keys())
    # Opening the empty thread read nothing, and the answer was generated here: its prompt
    # and answer ids made the mark, with no history read either.
    assert reads == []
    second = await Socket.open(alice)
    await second.send(type="open", conversation_id=conversation.pk)
    await second.until("thread")

    # The retained blocks are exactly the leading full blocks of the next turn's prompt.
    retained = list(bm.retention.hashes(key))
    assert retained
    await first.send(type="send", conversation_id=conversation.pk, content="And their keepers?")
    thread, _ = await first.until("thread")
    answer, _ = await first.finished(thread["messages"][-1]["id"])
    plan = (await answer_prompt(answer["id"], engine)).plan
    # Named as the chat's requests name them: salted per user after the system prompt.
    salt = cache_salt_options(alice.pk, plan.shared_prefix_tokens)
    assert salt["cache_namespace"] == f"user:{alice.pk}"
    salted = (salt_hash(salt["cache_namespace"]), salt["cache_salt_from"] // bm.block_size)
    assert prefix_hashes(plan.token_ids, bm.block_size, *salted, bm.hash_root)[: len(retained)] == retained
    assert answer["cached_tokens"] >= len(retained) * bm.block_size
    await first.close()
    await asyncio.sleep(0.2)
    assert key in bm.retention.keys()  # the second tab still shows it
    await second.close()
    await until(lambda: key not in bm.retention.keys())


async def until(condition, what: str = "retention did not change") -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


async def answered_conversation(make_user, make_conversation):
    from conversations.models import Message

    alice = await sync_to_async(make_user)("alice")
    conversation = await sync_to_async(make_conversation)(alice)
    question = await Message.objects.acreate(
        conversation=conversation, role="user", content="Tell me about lighthouses, please, at some length."
    )
    await Message.objects.acreate(
        conversation=conversation,
        parent=question,
        role="assistant",
        content="Lighthouses guide ships past rocks and shoals along dangerous coasts at night.",
        owner_process="process-a",
    )
    return conversation


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine")
async def test_marks_made_for_other_processes_are_theirs_and_released_when_they_die(
    make_user, make_conversation
):
    from conversations.chat.retention import ConversationRetention
    from conversations.cluster.registry import PROCESS_ID

    conversation = await answered_conversation(make_user, make_conversation)
    bm = (await aget_engine()).engine.block_manager
    on_b, on_c = retention_key(conversation.pk, "process-b"), retention_key(conversation.pk, "process-c")
    assert len({on_b, on_c, retention_key(conversation.pk)}) == 3  # one mark per asking process
    retention = ConversationRetention()
    retention.retain_for(conversation.pk, "process-b")
    retention.retain_for(conversation.pk, "process-c")
    await until(lambda: {on_b, on_c} <= set(bm.retention.keys()))
    assert bm.retention.hashes(on_b) and bm.retention.hashes(on_b) == bm.retention.hashes(on_c)
    retention.release_for(conversation.pk, "process-b")
    await until(lambda: on_b not in bm.retention.keys())
    assert on_c in bm.retention.keys()  # C's tab still shows it
    retention.forget_processes({PROCESS_ID, "process-b"})  # C died without releasing
    await until(lambda: on_c not in bm.retention.keys())


@pytest.mark.django_db(transaction=True)
async def test_the_mark_goes_to_the_live_owner_else_stays_in_this_process(
    make_user, make_conversation, monkeypatch
):
    from conversations.chat.retention import kv_holder
    from conversations.cluster import registry as cluster

    conversation = await answered_conversation(make_user, make_conversation)
    alive: dict[str, cluster.ProcessInfo] = {}

    async def live_processes() -> dict[str, cluster.ProcessInfo]:
        return alive

    monkeypatch.setattr(cluster, "enabled", lambda: True)
    monkeypatch.setattr(cluster, "live_processes", live_processes)
    assert await kv_holder(conversation.pk) is None  # the owner is gone: this process
    alive["process-a"] = cluster.ProcessInfo("process-a", channel="specific.a!1", ready=True)
    assert (await kv_holder(conversation.pk)).pid == "process-a"
    monkeypatch.setattr(cluster, "enabled", lambda: False)
    assert await kv_holder(conversation.pk) is None  # one process: always this one


def test_an_answers_own_ids_stand_for_the_next_prompt_only_where_the_render_keeps_them():
    from conversations.chat.answers import _next_turn_prefix
    from conversations.chat.records import Answer

    def answer(**fields) -> Answer:
        gen = Answer(message_id=1, conversation_id=2, owner_id=3, request_id="r")
        gen.prompt_ids, gen.token_ids = [10, 11, 12], [20, 21]
        for name, value in fields.items():
            setattr(gen, name, value)
        return gen

    complete, interrupted = Message.Status.COMPLETE, Message.Status.INTERRUPTED
    assert _next_turn_prefix(answer(), complete) == [10, 11, 12, 20, 21]
    assert _next_turn_prefix(answer(), interrupted) == [10, 11, 12, 20, 21]
    assert _next_turn_prefix(answer(), Message.Status.ERROR) == []
    assert _next_turn_prefix(answer(prompt_ids=None), complete) == []  # not exact, or history cut
    assert _next_turn_prefix(answer(token_ids=[]), complete) == []
    assert _next_turn_prefix(answer(tools=object()), complete) == []
    assert _next_turn_prefix(answer(tool_calls=[{"id": "c"}]), complete) == []
    thinking = answer()
    thinking.reasoning.text = "first, ..."
    assert _next_turn_prefix(thinking, complete) == []
