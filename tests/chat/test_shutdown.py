"""SIGTERM stops a real Daphne process within a bound whatever it is doing, and leaves the
database in order: a live answer saved ``interrupted`` with its text so far, nothing left
``streaming``, no title written half-way, no data job left ``running``.

Each case starts its own server (the signal ends it) on a model slowed down per step, so
that the work is still in flight when the signal comes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections

from conversations.models import Conversation, DataJob, Message
from conversations.transfer.exporting import FORMAT, VERSION
from tests.chat.test_cluster import Tab
from tests.conftest import session_cookie_for
from tests.live_site import LiveSite, launch_live_site, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
STOP_BOUND_SECONDS = 10.0
# Titles and data jobs run inside the site process only under eager Celery (with REDIS_URL a
# worker runs them), so those cases start their site without REDIS_URL.
IN_A_WORKER_WITH_REDIS = {"title", "export", "import"}
SUMMARY = re.compile(
    r"shutdown: (?P<answers>\d+) answers? interrupted, (?P<titles>\d+) title jobs? cancelled, "
    r"(?P<jobs>\d+) data jobs? stopped"
)


def start_site(model_dir: Path, log_dir: Path, without: tuple[str, ...] = (), **env: str) -> LiveSite:
    return wait_until_ready(
        launch_live_site(
            model_dir,
            log_dir,
            without=without,
            ENGINE_LOADER="tests.support.slow_model.slow_tiny_model",
            SLOW_MODEL_STEP_SECONDS=env.pop("SLOW_MODEL_STEP_SECONDS", "0.1"),
            ENGINE_KV_CACHE_GB="0.25",
            PARTIAL_SAVE_SECONDS="0.5",
            EXPORT_INLINE_MAX_MESSAGES="0",
            **env,
        )
    )


def terminate(site: LiveSite) -> float:
    """SIGTERM, then the seconds until the process was gone."""
    started = time.monotonic()
    site.process.send_signal(signal.SIGTERM)
    try:
        site.process.wait(timeout=STOP_BOUND_SECONDS + 20)
    except subprocess.TimeoutExpired:
        site.process.kill()
        site.process.wait()
        pytest.fail(f"still running {STOP_BOUND_SECONDS + 20:g} s after SIGTERM:\n{site.log()[-4000:]}")
    return time.monotonic() - started


def summary(site: LiveSite) -> dict[str, int]:
    found = SUMMARY.search(site.log())
    assert found, f"no shutdown summary in the log:\n{site.log()[-4000:]}"
    return {name: int(value) for name, value in found.groupdict().items()}


class Session:
    """A signed-in browser: the websocket tabs and the data page's forms."""

    def __init__(self, site: LiveSite, cookies: dict[str, str]) -> None:
        self.site, self.cookies = site, cookies

    async def tab(self, conversation: Conversation) -> Tab:
        header = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        return await Tab.open(SimpleNamespace(site=self.site), header, conversation)

    def post_form(self, path: str, **kwargs) -> int | None:
        """Posts as the data page does: the response's status, None if there was none."""
        with httpx.Client(base_url=self.site.url, cookies=self.cookies, timeout=60) as client:
            client.get("/settings/data/")
            token = client.cookies[settings.CSRF_COOKIE_NAME]
            data = {"csrfmiddlewaretoken": token, **kwargs.pop("data", {})}
            try:
                return client.post(path, data=data, **kwargs).status_code
            except httpx.HTTPError:
                return None


@pytest.fixture
def user(transactional_db):
    return get_user_model().objects.create(username=f"u{uuid.uuid4().hex[:8]}")


@pytest.fixture(autouse=True)
async def _orm_connections_closed():
    """The async ORM's thread keeps its connection; PostgreSQL would not drop the test database."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def cookies(user) -> dict[str, str]:
    name, _, value = session_cookie_for(user).decode().partition("=")
    return {name: value}


# --- Each kind of work: start it (it is in flight on return), then check what the signal left


@dataclass
class Server:
    site: LiveSite
    user: Any
    cookies: dict[str, str]

    def session(self) -> Session:
        return Session(self.site, self.cookies)


async def start_answer(server: Server) -> tuple[int, str]:
    """A long answer, a few deltas in: its id and the text its tab shows."""
    conversation = await Conversation.objects.acreate(owner=server.user, temperature=0.0, max_tokens=1500)
    tab = await server.session().tab(conversation)
    await tab.send(type="send", content="Tell me a long story")
    answer_id = await tab.answer_id()
    for _ in range(3):
        await tab.until("delta", message_id=answer_id)
    return answer_id, tab.text[answer_id]


async def check_answer(server: Server, started: tuple[int, str]) -> None:
    answer_id, shown = started
    saved = await Message.objects.aget(pk=answer_id)
    assert (saved.status, saved.finish_reason) == (Message.Status.INTERRUPTED, "abort")
    assert shown and saved.content.startswith(shown)  # the text so far: at least what the tab showed
    assert summary(server.site)["answers"] == 1


async def start_title(server: Server) -> Conversation:
    conversation = await Conversation.objects.acreate(owner=server.user, temperature=0.0, max_tokens=4)
    tab = await server.session().tab(conversation)
    await tab.send(type="send", content="Plan a three-day trip to Lisbon")
    await tab.finished(await tab.answer_id())
    await asyncio.sleep(0.5)  # the title job has started: 25 slow steps to go
    return conversation


async def check_title(server: Server, conversation: Conversation) -> None:
    await conversation.arefresh_from_db()
    assert conversation.title_source == Conversation.TitleSource.AUTO
    assert summary(server.site)["titles"] == 1


def many_conversations(user, count: int) -> None:
    """Enough for an export of several seconds (each conversation is a few queries)."""
    made = Conversation.objects.bulk_create(Conversation(owner=user, title=f"c{i}") for i in range(count))
    Message.objects.bulk_create(
        Message(conversation=c, role=Message.Role.USER, content="hello " * 20) for c in made
    )


def import_file(count: int) -> bytes:
    messages = [
        {"id": 1, "role": "user", "content": "hi " * 20},
        {"id": 2, "parent": 1, "role": "assistant", "content": "ho " * 50},
    ]
    conversations = [{"title": f"c{i}", "messages": messages, "current_leaf": 2} for i in range(count)]
    return json.dumps({"format": FORMAT, "version": VERSION, "conversations": conversations}).encode()


async def start_job(server: Server, post: Callable[[Session], int | None]) -> tuple[DataJob, asyncio.Task]:
    """The data page's form posted (the eager job runs inside the request), until the job runs."""
    session = server.session()
    posting = asyncio.create_task(asyncio.to_thread(post, session))
    for _ in range(600):
        job = await DataJob.objects.filter(owner=server.user).afirst()
        if job is not None and job.status == DataJob.Status.RUNNING:
            return job, posting
        await asyncio.sleep(0.05)
    raise AssertionError(f"the job never ran: {job and job.status}")


async def check_job(server: Server, started: tuple[DataJob, asyncio.Task]) -> None:
    job, posting = started
    assert await posting == 302  # the request was seen to its end: back to the data page
    await job.arefresh_from_db()
    assert job.status == DataJob.Status.FAILED and "server stopped" in job.error, (job.status, job.error)
    assert job.finished_at is not None and job.payload is None
    assert summary(server.site)["jobs"] == 1


async def start_export(server: Server) -> tuple[DataJob, asyncio.Task]:
    await database_sync_to_async(many_conversations)(server.user, 3000)
    return await start_job(server, lambda s: s.post_form("/settings/data/export/", data={"format": "json"}))


async def start_import(server: Server) -> tuple[DataJob, asyncio.Task]:
    raw = import_file(1500)
    return await start_job(
        server, lambda s: s.post_form("/settings/data/import/", files={"file": ("a.json", raw)})
    )


async def check_import(server: Server, started: tuple[DataJob, asyncio.Task]) -> None:
    await check_job(server, started)
    imported = Conversation.objects.filter(owner=server.user, title_source=Conversation.TitleSource.IMPORTED)
    assert not await imported.aexists()  # all or nothing


WORK = {
    "answer": (start_answer, check_answer),
    "title": (start_title, check_title),
    "export": (start_export, check_job),
    "import": (start_import, check_import),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "kinds",
    [
        ["answer"],
        ["title"],
        ["export"],
        # The import alone is this case less the answer: the same site (eager Celery) and the
        # same checks of the job. The answer's save waits for the write lock the import holds
        # (SQLite): cut first.
        ["answer", "import"],
    ],
    ids="+".join,
)
async def test_sigterm_stops_the_server_within_the_bound_and_leaves_no_work_running(
    kinds, user, cookies, tiny_model_dir, tmp_path
):
    # A title runs beside its answer from the send on: slower steps keep it from finishing
    # within the half second the test waits after the answer.
    env = {"TITLES_FROM_MODEL": "true", "SLOW_MODEL_STEP_SECONDS": "0.4"} if "title" in kinds else {}
    without = ("REDIS_URL",) if IN_A_WORKER_WITH_REDIS.intersection(kinds) else ()
    site = await asyncio.to_thread(start_site, tiny_model_dir, tmp_path, without, **env)
    server = Server(site, user, cookies)
    try:
        started = [await WORK[kind][0](server) for kind in kinds]
        stopped_in = await asyncio.to_thread(terminate, site)
    finally:
        if site.process.poll() is None:
            site.process.kill()
    print(f"{'+'.join(kinds)}: stopped {stopped_in:.2f} s after SIGTERM")
    for kind, state in zip(kinds, started, strict=True):
        await WORK[kind][1](server, state)
    assert stopped_in < STOP_BOUND_SECONDS, site.log()[-4000:]
    assert "forcing exit" not in site.log()  # the work let go: the watchdog was not needed
    assert not await Message.objects.filter(status=Message.Status.STREAMING).aexists()
    assert not await DataJob.objects.filter(status=DataJob.Status.RUNNING).aexists()


def test_the_watchdog_ends_a_process_whose_threads_will_not_let_go():
    """The last resort: a thread that never returns would keep the interpreter joining it."""
    code = (
        "import threading, time\n"
        "from conversations.ops.stopping import arm_watchdog\n"
        "threading.Thread(target=time.sleep, args=(120,)).start()\n"
        "arm_watchdog(1.0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < STOP_BOUND_SECONDS
    assert result.returncode == 1 and "forcing exit" in result.stderr, result.stderr
