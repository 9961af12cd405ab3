"""Two real Daphne processes on one PostgreSQL and one Redis act as one site.

Each process runs its own engine on the tiny random model. The tabs are real websocket
clients. Only the multi-process set-up can show these behaviours, so without
DATABASE_URL and REDIS_URL (the SQLite smoke run) the module is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async

from conversations.models import Conversation, Message
from tests.conftest import session_cookie_for
from tests.support.fakes import SCRIPTED_ANSWER, SCRIPTED_REASONING

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.smoke,  # so the SQLite smoke run reports why it skips them
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs DATABASE_URL and REDIS_URL: several processes share PostgreSQL and Redis",
    ),
]

LONG = {"temperature": 0.0, "max_tokens": 1500}
MEDIUM = {"temperature": 0.0, "max_tokens": 96}
SHORT = {"temperature": 0.0, "max_tokens": 16}
GRACE_SECONDS = 1.0
MAX_LIVE_PER_USER = 2


@pytest.fixture(scope="module")
def cluster_model_dir(tmp_path_factory):
    """Deeper and wider than the session's tiny model: on an idle machine that one writes
    its whole 2,048-token context in about two seconds, so a long answer would end by
    itself before the grace period, a stop or a kill could reach it."""
    from tests.support.fakes import make_tiny_model_dir

    return make_tiny_model_dir(
        tmp_path_factory.mktemp("cluster-model"),
        arch="llama",
        num_hidden_layers=24,
        hidden_size=256,
        intermediate_size=768,
    )


@contextlib.contextmanager
def running_cluster(model_dir, tmp_path_factory, **extra_env: str) -> Iterator[list[Process]]:
    """Processes A and B: one registry prefix (one site), short grace and save periods."""
    import redis

    from tests.live_site import health_details, launch_live_site, stop_live_site, wait_until_ready

    prefix = f"test-cluster-{uuid.uuid4().hex[:8]}"
    env = {
        "CLUSTER_PREFIX": prefix,
        "GENERATION_GRACE_SECONDS": str(GRACE_SECONDS),
        "PARTIAL_SAVE_SECONDS": "0.5",
        "MAX_LIVE_PER_USER": str(MAX_LIVE_PER_USER),
        "ENGINE_KV_CACHE_GB": "0.25",
        **extra_env,
    }
    log_dir = tmp_path_factory.mktemp("cluster")
    sites = [launch_live_site(model_dir, log_dir, **env) for _ in range(2)]
    try:
        for site in sites:
            wait_until_ready(site)
        # Both have advertised themselves (with their engines ready) in the registry.
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            entries = [json.loads(v) for v in client.mget(client.keys(f"{prefix}:proc:*")) if v]
            if len([e for e in entries if e["ready"]]) == 2:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the processes did not advertise themselves")
        yield [Process(site, health_details(site.url, timeout=5)["process"]["id"], prefix) for site in sites]
    finally:
        for site in sites:
            if site.process.poll() is None:
                stop_live_site(site)


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, cluster_model_dir, tmp_path_factory):
    with running_cluster(cluster_model_dir, tmp_path_factory) as processes:
        yield processes


@pytest.fixture
def reasoning_cluster(django_db_setup, django_db_blocker, cluster_model_dir, tmp_path_factory):
    """Two more processes, whose engines run the scripted reasoning model (a fixed think +
    answer; its pool holds one number per token, so a small budget is plenty). For one
    test: they stop as soon as it ends rather than share the CPU with the module's others."""
    loader = "tests.support.fakes.scripted_reasoning_model"
    with running_cluster(
        cluster_model_dir, tmp_path_factory, ENGINE_LOADER=loader, ENGINE_KV_CACHE_GB="0.0001"
    ) as processes:
        yield processes


class Process:
    def __init__(self, site, pid: str, prefix: str) -> None:
        self.site, self.pid, self.prefix = site, pid, prefix

    def stats(self) -> dict:
        from tests.live_site import health_details

        return health_details(self.site.url, timeout=5)["engine"]["stats"]

    def advertised_load(self) -> int:
        """The load routing reads for this process (its registry entry, refreshed every 2 s)."""
        import redis

        entry = json.loads(
            redis.Redis.from_url(os.environ["REDIS_URL"]).get(f"{self.prefix}:proc:{self.pid}")
        )
        return max(entry["running"] + entry["waiting"], entry["live"])


async def until_idle(processes: list[Process]) -> None:
    """Every process advertises no load, so that routing picks the tab's own process (a tie)
    rather than one whose entry still counts the previous test's answers."""
    for _ in range(300):
        if not any(p.advertised_load() for p in processes):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still busy: {[p.advertised_load() for p in processes]}")


class Tab:
    """A browser tab's websocket on one process."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.text: dict[int, str] = {}  # what this tab shows of each message
        self.reasoning: dict[int, str] = {}  # ... of each answer's thinking
        self.deltas: dict[int, int] = {}
        self.thinking_after_answer: set[int] = set()  # answers whose thinking came after text

    @classmethod
    async def open(cls, process: Process, cookie: str, conversation: Conversation | None = None) -> Tab:
        import websockets

        url = process.site.url.replace("http://", "ws://") + "/ws/chat/"
        ws = await websockets.connect(
            url, additional_headers={"Cookie": cookie, "Origin": "http://127.0.0.1"}, max_size=None
        )
        tab = cls(ws)
        if conversation is not None:
            await tab.send(type="open", conversation_id=conversation.pk)
            await tab.until("thread")
        return tab

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def receive(self, timeout: float) -> dict:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        if event["type"] == "thread":
            for message in event["messages"]:
                self.text[message["id"]] = message["content"]
                self.reasoning[message["id"]] = message["reasoning"]
        elif event["type"] == "delta":
            message_id = event["message_id"]
            if event.get("reasoning") and self.text.get(message_id):
                self.thinking_after_answer.add(message_id)
            self.text[message_id] = self.text.get(message_id, "") + event["text"]
            self.reasoning[message_id] = self.reasoning.get(message_id, "") + event.get("reasoning", "")
            self.deltas[message_id] = self.deltas.get(message_id, 0) + 1
        return event

    async def until(self, kind: str, timeout: float = 60, **match) -> dict:
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {kind} {match}; saw {[e['type'] for e in seen]}"
            try:
                event = await self.receive(remaining)
            except TimeoutError:
                raise AssertionError(f"no {kind} {match}; saw {[e['type'] for e in seen]}") from None
            seen.append(event)
            if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                return event

    async def until_any(self, kinds: tuple[str, ...], timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            event = await self.receive(max(0.01, deadline - time.monotonic()))
            if event["type"] in kinds:
                return event

    async def finished(self, message_id: int, timeout: float = 60) -> dict:
        while True:
            event = await self.until("finished", timeout=timeout)
            if event["message"]["id"] == message_id:
                return event["message"]

    async def answer_id(self) -> int:
        """The id of the answer a send just created (the last message of the next thread)."""
        while True:
            thread = await self.until("thread")
            last = thread["messages"][-1] if thread["messages"] else None
            if last and last["role"] == "assistant" and last["status"] == "streaming":
                return last["id"]

    async def close(self) -> None:
        await self.ws.close()


@pytest.fixture
async def user(make_user):
    return await sync_to_async(make_user)(f"u{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def cookie(user):
    return (await sync_to_async(session_cookie_for)(user)).decode()


async def conversation_of(user, **fields) -> Conversation:
    return await Conversation.objects.acreate(owner=user, **fields)


async def test_a_tab_on_b_sees_the_live_deltas_of_an_answer_generated_on_a(cluster, user, cookie):
    a, b = cluster
    conversation = await conversation_of(user, **MEDIUM)
    on_a = await Tab.open(a, cookie, conversation)
    on_b = await Tab.open(b, cookie, conversation)
    await on_a.send(type="send", content="Tell me a story")
    answer_id = await on_a.answer_id()
    final_a = await on_a.finished(answer_id)
    final_b = await on_b.finished(answer_id)
    assert (await Message.objects.aget(pk=answer_id)).owner_process == a.pid
    assert final_a["status"] == "complete" and final_a["content"]
    assert final_b["content"] == final_a["content"]
    assert on_b.text[answer_id] == final_a["content"]  # the deltas B relayed add up to the answer
    assert on_b.deltas.get(answer_id, 0) >= 2  # live pieces, not only the final text
    await on_a.close()
    await on_b.close()


async def test_a_tab_in_another_process_streams_the_thinking_of_an_answer_before_its_text(
    reasoning_cluster, user, cookie
):
    a, b = reasoning_cluster
    conversation = await conversation_of(user, **MEDIUM)
    tabs = [await Tab.open(p, cookie, conversation) for p in (a, b)]
    await tabs[0].send(type="send", content="Capital of France?")
    answer_id = await tabs[0].answer_id()
    finals = [await tab.finished(answer_id) for tab in tabs]
    owner = (await Message.objects.aget(pk=answer_id)).owner_process
    assert owner in (a.pid, b.pid) and all(
        (final["reasoning"], final["content"]) == (SCRIPTED_REASONING, SCRIPTED_ANSWER) for final in finals
    )
    # What each tab showed before the answer finished, the owner's tab and the tab that got
    # the relayed deltas alike: the thread, then the deltas; all the thinking before the text.
    for tab in tabs:
        assert (tab.reasoning[answer_id], tab.text[answer_id]) == (SCRIPTED_REASONING, SCRIPTED_ANSWER)
        assert answer_id not in tab.thinking_after_answer
    for tab in tabs:
        await tab.close()


async def test_closing_the_owners_only_tab_while_b_watches_does_not_abort_the_answer(cluster, user, cookie):
    a, b = cluster
    conversation = await conversation_of(user, **LONG)
    on_a = await Tab.open(a, cookie, conversation)
    on_b = await Tab.open(b, cookie, conversation)
    await on_a.send(type="send", content="Keep going")
    answer_id = await on_a.answer_id()
    await on_a.until("delta")
    await on_a.close()  # A has no tab left; B's tab still shows the conversation
    closed_at = time.monotonic()
    while time.monotonic() - closed_at < 2 * GRACE_SECONDS:
        event = await on_b.receive(timeout=10)
        # Not aborted when A's grace period ended.
        assert event["type"] != "finished", {k: event["message"].get(k) for k in ("status", "finish_reason")}
    await on_b.until("delta", message_id=answer_id)  # still streaming, well past the grace period
    await on_b.send(type="stop", message_id=answer_id)
    final = await on_b.finished(answer_id, timeout=10)
    assert final["status"] == "interrupted" and final["completion_tokens"] < LONG["max_tokens"]
    assert on_b.text[answer_id] == final["content"]
    await on_b.close()


async def test_a_stop_sent_from_b_ends_the_answer_generated_on_a(cluster, user, cookie):
    a, b = cluster
    conversation = await conversation_of(user, **LONG)
    on_a = await Tab.open(a, cookie, conversation)
    on_b = await Tab.open(b, cookie, conversation)
    await on_a.send(type="send", content="Keep going")
    answer_id = await on_a.answer_id()
    await on_b.until("delta", message_id=answer_id)
    # A tab opened on B mid-answer gets the saved text, the owner's snapshot, then deltas.
    late = await Tab.open(b, cookie, conversation)
    await late.until("delta", message_id=answer_id)
    await on_b.send(type="stop", message_id=answer_id)
    final = await on_b.finished(answer_id, timeout=5)
    assert final["status"] == "interrupted" and 0 < final["completion_tokens"] < LONG["max_tokens"]
    saved = await Message.objects.aget(pk=answer_id)
    assert saved.status == Message.Status.INTERRUPTED and saved.content == final["content"]
    assert (await late.finished(answer_id))["content"] == final["content"]
    assert late.text[answer_id] == on_b.text[answer_id] == final["content"]
    await on_a.close()
    await on_b.close()
    await late.close()


async def test_the_live_answer_limits_hold_under_simultaneous_sends_from_both_processes(
    cluster, user, cookie
):
    a, b = cluster
    # One conversation, one tab on each process, both sending at once: exactly one answer.
    conversation = await conversation_of(user, **LONG)
    tabs = [await Tab.open(p, cookie, conversation) for p in (a, b)]
    await asyncio.gather(*(t.send(type="send", content=f"Hello from {i}") for i, t in enumerate(tabs)))
    outcomes = await asyncio.gather(*(_started_or_refused(t) for t in tabs))
    assert sorted(kind for kind, _ in outcomes) == ["busy", "started"]
    assert await Message.objects.filter(conversation=conversation).acount() == 2  # nothing half-made
    answer_id = next(value for kind, value in outcomes if kind == "started")

    # Three more conversations at once from both processes, with one answer still live:
    # MAX_LIVE_PER_USER (2) in all, so one more starts and two are refused.
    others = [await conversation_of(user, **LONG) for _ in range(3)]
    more = [await Tab.open(p, cookie, c) for p, c in zip((a, b, a), others, strict=True)]
    await asyncio.gather(*(t.send(type="send", content="Hello") for t in more))
    results = await asyncio.gather(*(_started_or_refused(t) for t in more))
    assert sorted(kind for kind, _ in results) == ["busy", "busy", "started"]
    live = await Message.objects.filter(conversation__owner=user, status=Message.Status.STREAMING).acount()
    assert live == MAX_LIVE_PER_USER

    for tab in more:  # the refused sockets stay open
        await tab.send(type="ping")
        await tab.until("pong")
    started = [(tab, value) for tab, (kind, value) in zip(more, results, strict=True) if kind == "started"]
    for tab, message_id in [*started, (tabs[0], answer_id)]:
        await tab.send(type="stop", message_id=message_id)
        await tab.finished(message_id, timeout=10)
    for tab in tabs + more:
        await tab.close()


async def _started_or_refused(tab: Tab) -> tuple[str, int | str]:
    while True:
        event = await tab.until_any(("thread", "error"))
        if event["type"] == "error":
            return event.get("code"), event["detail"]
        last = event["messages"][-1] if event["messages"] else None
        if last and last["status"] == "streaming":
            return "started", last["id"]


async def test_turn_two_sent_from_b_is_served_by_as_engine(cluster, user, cookie):
    a, b = cluster
    await until_idle(cluster)
    conversation = await conversation_of(user, system_prompt="You are terse.", **SHORT)
    on_a = await Tab.open(a, cookie, conversation)
    await on_a.send(type="send", content="Hello there, how are you today? Tell me about your day.")
    first = await on_a.finished(await on_a.answer_id())
    assert first["status"] == "complete"
    await on_a.close()
    a_before, b_before = a.stats(), b.stats()

    on_b = await Tab.open(b, cookie, conversation)
    await on_b.send(type="send", content="And tomorrow?")
    second_id = await on_b.answer_id()
    second = await on_b.finished(second_id)
    assert second["status"] == "complete"
    a_after, b_after = a.stats(), b.stats()
    # A's engine prefilled turn 2 and found turn 1's blocks; B's engine saw no prompt at all.
    assert a_after["prefix_hit_tokens"] - a_before["prefix_hit_tokens"] >= 16
    assert b_after["total_prompt_tokens"] == b_before["total_prompt_tokens"]
    assert second["cached_tokens"] >= 16
    assert (await Message.objects.aget(pk=second_id)).owner_process == a.pid
    await on_b.close()


async def settled(process: Process, field: str, expected) -> dict:
    """``process``'s engine stats once ``field`` equals ``expected`` (marks are made and
    released in the background, after the websocket event that causes them)."""
    for _ in range(300):
        stats = process.stats()
        if stats[field] == expected:
            return stats
        await asyncio.sleep(0.1)
    raise AssertionError(f"{field} stayed {stats[field]}, not {expected}")


async def test_a_tab_elsewhere_keeps_a_conversation_retained_in_the_engine_that_answered_it(
    cluster, user, cookie
):
    # Earlier tests closed all their tabs: their marks are released (wherever they were).
    for process in cluster:
        await settled(process, "kv_retained_keys", 0)
    conversation = await conversation_of(user, system_prompt="You are terse.", **SHORT)
    first = await Tab.open(cluster[0], cookie, conversation)
    await first.send(type="send", content="Hello there, how are you today? Tell me about your day.")
    answer_id = await first.answer_id()
    assert (await first.finished(answer_id))["status"] == "complete"
    await first.close()
    # Routing picked the owner (the less busy process); the other one is "elsewhere".
    owner_pid = (await Message.objects.aget(pk=answer_id)).owner_process
    owner, elsewhere = sorted(cluster, key=lambda p: p.pid != owner_pid)
    released = await settled(owner, "kv_retained_keys", 0)

    # Only a tab on the other process shows it: the mark is made in the owner, not there.
    tab = await Tab.open(elsewhere, cookie, conversation)
    held = await settled(owner, "kv_retained_keys", 1)
    assert held["kv_retained_blocks"] > released["kv_retained_blocks"]  # the history's blocks
    assert elsewhere.stats()["kv_retained_keys"] == 0
    await tab.close()
    await settled(owner, "kv_retained_keys", 0)
    assert elsewhere.stats()["kv_retained_keys"] == 0


async def test_killing_the_owner_interrupts_its_answer_keeping_the_text_and_b_can_regenerate(
    cluster, user, cookie
):
    """Last in the module: it kills the process that generates the answer (routing picks
    it, so either one), and the other one takes over."""
    a, b = cluster
    conversation = await conversation_of(user, **LONG)
    on_a = await Tab.open(a, cookie, conversation)
    on_b = await Tab.open(b, cookie, conversation)
    await on_a.send(type="send", content="Keep going")
    answer_id = await on_a.answer_id()
    await on_b.until("delta", message_id=answer_id)
    for _ in range(50):  # a partial save has happened
        if (await Message.objects.aget(pk=answer_id)).content:
            break
        await asyncio.sleep(0.1)
    owner_pid = (await Message.objects.aget(pk=answer_id)).owner_process
    owner, survivor = (a, b) if owner_pid == a.pid else (b, a)
    watcher = on_b if owner is a else on_a
    os.kill(owner.site.process.pid, signal.SIGKILL)
    owner.site.process.wait(timeout=10)

    final = await watcher.finished(answer_id, timeout=90)  # ~15 s idle; far more when the machine is busy
    assert final["status"] == "interrupted" and final["content"]
    saved = await Message.objects.aget(pk=answer_id)
    assert saved.status == Message.Status.INTERRUPTED and saved.content == final["content"]

    await watcher.send(type="regenerate", message_id=answer_id)
    regenerated_id = await watcher.answer_id()
    await watcher.until("delta", message_id=regenerated_id)  # the survivor generates it
    await watcher.send(type="stop", message_id=regenerated_id)
    again = await watcher.finished(regenerated_id, timeout=90)
    assert again["status"] in ("interrupted", "complete")
    assert (await Message.objects.aget(pk=regenerated_id)).owner_process == survivor.pid
    await watcher.close()
