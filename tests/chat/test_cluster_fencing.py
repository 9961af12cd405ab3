"""Two real Daphne processes: sends handed to another process are acknowledged (or taken
back), and a process taken for dead never overwrites the answers failed over meanwhile.

Real processes, paused with SIGSTOP and resumed with SIGCONT: a long GC pause or a Redis
hiccup looks like this to the rest of the site. Skipped without DATABASE_URL and REDIS_URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message
from tests.chat import test_cluster as base
from tests.chat.test_cluster import LONG, Process, Tab, conversation_of, running_cluster, until_idle

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.smoke,
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs DATABASE_URL and REDIS_URL: several processes share PostgreSQL and Redis",
    ),
]

TINY = {"temperature": 0.0, "max_tokens": 4}
SENDS = 50
WAVE = 10  # sends in flight at once
ACK_SECONDS = 3.0

# The cluster module's fixtures, shared: the deeper tiny model, a user and their session.
cluster_model_dir, user, cookie = base.cluster_model_dir, base.user, base.cookie


@pytest.fixture(scope="module")
def pair(django_db_setup, django_db_blocker, cluster_model_dir, tmp_path_factory):
    """Processes A and B; one user may have every answer of a wave live at once."""
    with running_cluster(
        cluster_model_dir,
        tmp_path_factory,
        MAX_LIVE_PER_USER=str(SENDS),
        CLUSTER_ACK_SECONDS=str(ACK_SECONDS),
    ) as processes:
        yield processes


@contextlib.contextmanager
def paused(process: Process):
    """The process is frozen (SIGSTOP) until the block ends (SIGCONT), whatever happens."""
    os.kill(process.site.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.site.process.pid, signal.SIGCONT)


@sync_to_async
def answered_by(conversation: Conversation, pid: str) -> None:
    """A first exchange whose answer ``pid`` wrote: the next turn prefers that process."""
    _, answer = tree_ops.send_message(conversation, "Hello there", owner_process=pid)
    Message.objects.filter(pk=answer.pk).update(status=Message.Status.COMPLETE, content="Hi.")


async def streaming_ids(**filters) -> list[int]:
    rows = Message.objects.filter(status=Message.Status.STREAMING, **filters)
    return [pk async for pk in rows.values_list("pk", flat=True)]


async def eventually(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def _churn(process: Process, cookie: str, stop: asyncio.Event) -> int:
    """Tabs that open and close at once, as reloads and closed tabs do: each disconnect
    cancels a consumer's receive on that process's channel layer."""
    opened = 0
    while not stop.is_set():
        tab = await Tab.open(process, cookie)
        await tab.send(type="ping")
        await asyncio.sleep(random.uniform(0.0, 0.05))
        await tab.close()
        opened += 1
    return opened


async def _send(process: Process, cookie: str, conversation: Conversation) -> str:
    """A fresh tab on ``process`` sends into ``conversation``: what it hears first."""
    tab = await Tab.open(process, cookie)
    try:
        await tab.send(type="send", conversation_id=conversation.pk, content="Tell me something")
        try:
            event = await tab.until_any(("started", "error"), timeout=30)
        except TimeoutError:
            return "nothing"
        return event["type"] if event["type"] == "started" else f"error:{event.get('code')}"
    finally:
        await tab.close()


async def test_every_send_gets_started_or_error_while_other_tabs_open_and_close(pair, user, cookie):
    a, b = pair
    await until_idle(pair)
    # Most conversations were last answered by the process other than the sending tab's,
    # so the send is handed over there (affinity); every fifth is new (the least busy).
    plan = []
    for i in range(SENDS):
        sender, other = (a, b) if i % 2 else (b, a)
        conversation = await conversation_of(user, **TINY)
        if i % 5:
            await answered_by(conversation, other.pid)
        plan.append((sender, conversation))
    stop = asyncio.Event()
    churners = [asyncio.create_task(_churn(p, cookie, stop)) for p in (a, b)]
    started_at = time.monotonic()
    outcomes: list[str] = []
    try:
        for first in range(0, SENDS, WAVE):
            wave = plan[first : first + WAVE]
            outcomes += await asyncio.gather(*(_send(p, cookie, c) for p, c in wave))
    finally:
        stop.set()
        churned = sum(await asyncio.gather(*churners))
    elapsed = time.monotonic() - started_at
    lost = [(sender, c) for (sender, c), outcome in zip(plan, outcomes, strict=True) if outcome == "nothing"]
    assert not lost, await _diagnose(lost, pair)
    assert all(o == "started" or o.startswith("error") for o in outcomes), outcomes
    assert churned >= 20, churned  # the churn really ran alongside
    answers = await _owners(plan)
    handed_over = sum(owner != sender for sender, owner in answers)
    assert handed_over >= SENDS // 2, answers  # most sends crossed to the other process
    # No answer is left streaming with nobody working on it.
    conversation_ids = [c.pk for _, c in plan]
    await eventually(
        lambda: _none_streaming(conversation_ids), 60, "an answer stayed streaming after its send"
    )
    print(f"{SENDS} sends, {handed_over} handed over, {churned} churned tabs, {elapsed:.1f} s")


async def _diagnose(lost: list[tuple[Process, Conversation]], processes: list[Process]) -> str:
    """Where each lost send got to: its answer's row and what the processes logged of it."""
    lines = []
    for sender, conversation in lost:
        answer = await Message.objects.filter(conversation=conversation, role="assistant").alatest(
            "created_at", "id"
        )
        lines.append(
            f"conversation {conversation.pk} from {sender.pid[:8]}: answer {answer.pk} {answer.status} "
            f"owner {answer.owner_process[:8]} tokens {answer.completion_tokens}"
        )
        for process in processes:
            lines += [
                f"  {process.pid[:8]}: {line}"
                for line in process.site.log().splitlines()
                if f" {answer.pk} " in line
            ]
    return "\n".join(lines)


async def _owners(plan) -> list[tuple[str, str]]:
    """(sending tab's process, the answer's owner) for each send."""
    out = []
    for sender, conversation in plan:
        answer = await Message.objects.filter(conversation=conversation, role="assistant").alatest(
            "created_at", "id"
        )
        out.append((sender.pid, answer.owner_process))
    return out


async def _none_streaming(conversation_ids: list[int]) -> bool:
    return not await streaming_ids(conversation_id__in=conversation_ids)


async def test_a_send_the_owner_does_not_claim_in_time_is_generated_by_the_tabs_process(pair, user, cookie):
    a, b = pair
    await until_idle(pair)
    conversation = await conversation_of(user, **TINY)
    await answered_by(conversation, b.pid)  # the next turn goes to B (affinity)
    on_a = await Tab.open(a, cookie, conversation)
    prompts_on_b = b.stats()["total_prompt_tokens"]
    with paused(b):  # B is still in the registry (for 10 s) but cannot claim anything
        sent_at = time.monotonic()
        await on_a.send(type="send", content="Are you there?")
        answer_id = await on_a.answer_id()
        started = await on_a.until("started", timeout=30, message_id=answer_id)
        waited = time.monotonic() - sent_at
    assert ACK_SECONDS <= waited, waited  # A waited for B's claim first
    final = await on_a.finished(answer_id)
    assert started["message_id"] == answer_id and final["status"] == "complete"
    saved = await Message.objects.aget(pk=answer_id)
    assert saved.owner_process == a.pid and saved.status == Message.Status.COMPLETE
    # B got the request once it resumed, found it claimed, and generated nothing.
    await eventually(
        lambda: _logged(b, f"answer {answer_id} was claimed elsewhere"), 20, "B never saw the late request"
    )
    assert b.stats()["total_prompt_tokens"] == prompts_on_b
    await on_a.close()


async def test_a_streaming_answer_its_owner_never_started_is_interrupted_and_the_tabs_told(
    pair, user, cookie
):
    a, b = pair
    conversation = await conversation_of(user, **TINY)
    on_b = await Tab.open(b, cookie, conversation)
    # An answer for A whose chat.generate never came, and whose tab's process is gone too.
    _, answer = await sync_to_async(tree_ops.send_message)(conversation, "Hello?", owner_process=a.pid)
    await Message.objects.filter(pk=answer.pk).aupdate(updated_at=timezone.now() - timedelta(minutes=1))
    final = await on_b.finished(answer.pk, timeout=30)  # A's sweep runs every 3 s
    assert final["status"] == Message.Status.INTERRUPTED
    assert not await streaming_ids(conversation=conversation)
    await on_b.close()


async def _logged(process: Process, text: str) -> bool:
    return text in process.site.log()


async def test_a_process_paused_past_the_reap_deadline_never_overwrites_its_failed_over_answer(
    pair,
    user,
    cookie,
):
    """Last in the module: A is taken for dead."""
    a, b = pair
    await until_idle(pair)
    conversation = await conversation_of(user, **LONG)
    on_a = await Tab.open(a, cookie, conversation)
    on_b = await Tab.open(b, cookie, conversation)
    await on_a.send(type="send", content="Keep going")
    answer_id = await on_a.answer_id()
    assert (await Message.objects.aget(pk=answer_id)).owner_process == a.pid
    await on_b.until("delta", message_id=answer_id)

    async def partly_saved() -> bool:
        return bool((await Message.objects.aget(pk=answer_id)).content)

    await eventually(partly_saved, 10, "no partial save")
    with paused(a):
        # B takes A for dead (its entry expires after 10 s) and fails the answer over,
        # keeping the text A saved last.
        reaped = await on_b.finished(answer_id, timeout=90)
        saved = await Message.objects.aget(pk=answer_id)
    assert reaped["status"] == saved.status == Message.Status.INTERRUPTED
    assert saved.content and reaped["content"] == saved.content

    # A resumes with the answer still running in its engine: it finds the row is no longer
    # its own, aborts the request and writes nothing.
    async def a_idle() -> bool:
        stats = await sync_to_async(a.stats)()
        return stats["running"] + stats["waiting"] == 0

    await eventually(a_idle, 30, "A kept generating the failed-over answer")
    await eventually(
        lambda: _logged(a, f"answer {answer_id} is no longer this process's"), 10, "A never noticed"
    )
    after = [event async for event in _events(on_b, seconds=2.0)]
    assert not [e for e in after if e.get("message_id") == answer_id and e["type"] in ("delta", "started")]
    again = await Message.objects.aget(pk=answer_id)
    assert (again.status, again.content, again.updated_at) == (saved.status, saved.content, saved.updated_at)
    # A's own tab ends up showing what is stored, not what A generated after the pause.
    assert _final_text([e async for e in _events(on_a, seconds=1.0)], answer_id) == saved.content

    # The conversation takes a new answer at once, and it is the only one streaming.
    await on_b.send(type="send", content="Are you back?")
    new_id = await on_b.answer_id()
    assert await streaming_ids(conversation=conversation) == [new_id]
    await on_b.until("started", message_id=new_id)
    await on_b.send(type="stop", message_id=new_id)
    final = await on_b.finished(new_id, timeout=30)
    assert final["status"] in ("interrupted", "complete")
    assert not await streaming_ids(conversation=conversation)
    await on_a.close()
    await on_b.close()


async def _events(tab: Tab, seconds: float):
    """What the tab hears in the next ``seconds``."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            yield await tab.receive(remaining)
        except TimeoutError:
            return


def _final_text(events: list[dict], message_id: int) -> str | None:
    """The answer's text as a tab shows it after ``events``: the last ``finished`` message
    and any deltas after it; None if no ``finished`` for it came."""
    text = None
    for event in events:
        if event["type"] == "finished" and event["message"]["id"] == message_id:
            text = event["message"]["content"]
        elif event["type"] == "delta" and event["message_id"] == message_id and text is not None:
            text += event["text"]
    return text
