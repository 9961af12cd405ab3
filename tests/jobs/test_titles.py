"""Model-written titles: the plain logic, the task's retry when no site process answers,
the eager path on the websocket, and a real Celery worker asking this process's engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from celery.exceptions import Retry
from channels.db import database_sync_to_async

from chatsite.celery import app as celery_app
from conversations.chat import titles
from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine
from conversations.tasks import generate_title
from tests.chat.conftest import Socket
from tests.jobs.conftest import answer

ROOT = Path(__file__).resolve().parents[2]


def test_a_reply_becomes_a_title_of_at_most_eight_words():
    assert titles.clean_title('Title: "Planning a **Trip** to Lisbon in May."\nMore text') == (
        "Planning a Trip to Lisbon in May"
    )
    assert titles.clean_title("one two three four five six seven eight nine ten") == (
        "one two three four five six seven eight"
    )
    assert titles.clean_title("  \n\n  ") == ""


def test_the_prompt_holds_the_first_exchange_cut_to_size():
    messages = titles.title_messages("Q" * 5000, "A" * 5000)
    assert messages[0]["role"] == "system" and "8 words" in messages[0]["content"]
    assert messages[1]["content"].count("Q") == titles.EXCERPT_CHARS


@pytest.mark.django_db
def test_only_the_first_answer_of_an_auto_titled_conversation_asks_for_a_title(alice):
    conversation = Conversation.objects.create(owner=alice)
    _, first = tree_ops.send_message(conversation, "Plan a trip")
    answer(first, "Sure.")
    _, second = tree_ops.send_message(conversation, "And food?")
    assert titles.is_first_answer(first.pk) and not titles.is_first_answer(second.pk)
    assert titles.first_exchange(conversation.pk) == ("Plan a trip", "Sure.")
    Conversation.objects.filter(pk=conversation.pk).update(title_source="user")
    assert not titles.is_first_answer(first.pk) and titles.first_exchange(conversation.pk) is None


@pytest.mark.django_db
def test_a_title_the_user_set_stays_theirs(client, alice):
    conversation = Conversation.objects.create(owner=alice)
    _, first = tree_ops.send_message(conversation, "Plan a trip")
    answer(first, "Sure.")
    client.force_login(alice)
    client.post(
        f"/chat/conversations/{conversation.pk}/update/",
        {"title": "My trip"},
        content_type="application/json",
    )
    conversation.refresh_from_db()
    assert (conversation.title, conversation.title_source) == ("My trip", "user")
    assert not titles.save_title(conversation.pk, "Model's idea")
    assert Conversation.objects.get(pk=conversation.pk).title == "My trip"

    # Changing only the settings leaves an automatic title the model's to write.
    other = Conversation.objects.create(owner=alice)
    client.post(
        f"/chat/conversations/{other.pk}/update/", {"temperature": 0.1}, content_type="application/json"
    )
    assert Conversation.objects.get(pk=other.pk).title_source == "auto"


@pytest.mark.django_db
def test_the_task_retries_later_when_no_site_process_answers(alice, settings):
    settings.TITLE_REPLY_SECONDS = 0.3
    conversation = Conversation.objects.create(owner=alice)
    _, first = tree_ops.send_message(conversation, "Plan a trip")
    answer(first, "Sure.")
    not_loaded = {"ready": False, "state": "not_loaded"}
    with (
        mock.patch("conversations.chat.titles.engine_status", return_value=not_loaded),
        mock.patch.object(generate_title, "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        generate_title.run(conversation.pk)  # as a worker runs it: not eager
    assert retry.call_args.kwargs["countdown"] == settings.TITLE_RETRY_SECONDS
    assert isinstance(retry.call_args.kwargs["exc"], titles.NoLiveEngine)
    assert Conversation.objects.get(pk=conversation.pk).title_source == "auto"


async def first_exchange_over_socket(
    user, title_timeout: float = 60
) -> tuple[Conversation, dict, list[dict]]:
    conversation = await Conversation.objects.acreate(owner=user, temperature=0.0, max_tokens=16)
    socket = await Socket.open(user)
    await socket.send(type="open", conversation_id=conversation.pk)
    await socket.until("thread")
    await socket.send(type="send", conversation_id=conversation.pk, content="Plan a three-day trip to Lisbon")
    await socket.finished()
    event, seen = await socket.until("title", timeout=title_timeout, conversation_id=conversation.pk)
    await socket.close()
    return conversation, event, seen


@database_sync_to_async  # closes its connection after: the test database can be dropped
def saved_state(conversation_id: int) -> tuple[Conversation, int, tuple[str, str] | None]:
    conversation = Conversation.objects.get(pk=conversation_id)
    count = Message.objects.filter(conversation_id=conversation_id).count()
    return conversation, count, titles.first_exchange_any(conversation_id)


async def assert_titled(conversation_id: int, event: dict, seen: list[dict]) -> None:
    conversation, count, exchange = await saved_state(conversation_id)
    assert conversation.title_source == "model" and conversation.title == event["title"]
    assert event["title"] and len(event["title"].split()) <= titles.MAX_TITLE_WORDS
    assert "conversations" in [e["type"] for e in seen]  # the sidebar reloads too
    assert count == 2  # the title request added no message
    # Greedy decoding: this process's engine gives the same title for the same exchange.
    expected = await titles.generate_with_engine(
        await aget_engine(), titles.title_messages(*exchange), conversation.owner_id
    )
    assert titles.clean_title(expected) == event["title"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tiny_engine", "eager_tasks")
@pytest.mark.smoke
async def test_after_the_first_answer_a_title_arrives_on_the_socket(quick_user, settings):
    settings.TITLES_FROM_MODEL = True
    alice = await sync_to_async(quick_user)("alice")
    conversation, event, seen = await first_exchange_over_socket(alice)
    await assert_titled(conversation.pk, event, seen)


# --- A real worker ------------------------------------------------------------------------


def start_worker(log_path: Path) -> subprocess.Popen:
    from tests.live_site import database_env

    env = {
        **os.environ,
        **database_env(),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    command = [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "--pool=solo", "--loglevel=INFO"]
    command += [
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"test-{uuid.uuid4().hex[:8]}@%h",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}:\n{log_path.read_text()}")
        if " ready." in log_path.read_text():
            return process
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"the worker did not start:\n{log_path.read_text()}")


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    celery_app.control.purge()  # tasks left by earlier runs without a worker
    log_path = tmp_path / "worker.log"
    process = start_worker(log_path)
    yield log_path
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.mark.skipif(
    not os.environ.get("REDIS_URL"),
    reason="a real Celery worker needs a broker: set REDIS_URL (the SQLite smoke run has none)",
)
@pytest.mark.usefixtures("tiny_engine")
async def test_a_real_worker_titles_the_conversation_through_a_live_site_engine(
    quick_user, settings, celery_worker_process
):
    """This process is the site (it holds the engine and the socket); the worker is another
    process with no model, and asks this one over the Redis channel layer."""
    settings.TITLES_FROM_MODEL = True
    alice = await sync_to_async(quick_user)("alice")
    try:
        conversation, event, seen = await first_exchange_over_socket(alice, title_timeout=90)
    except AssertionError:
        print(celery_worker_process.read_text())
        raise
    await assert_titled(conversation.pk, event, seen)
    log = celery_worker_process.read_text()
    assert "conversations.tasks.generate_title" in log and "succeeded" in log


def test_the_worker_side_imports_no_model_code():
    """What a worker imports (the app and every task module) pulls in neither torch nor the engine."""
    code = (
        "import sys, django; django.setup(); from chatsite.celery import app; app.loader.import_default_modules(); "
        "import conversations.tasks; print(sorted(m for m in ('torch', 'inference', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.usefixtures("tiny_engine")
async def test_a_title_prompt_is_salted_with_its_owner_past_the_shared_instruction():
    from conversations.chat.cache_salt import cache_options
    from inference import SamplingParams
    from inference.prompt import encode_segments

    engine = await aget_engine()
    question = f"{uuid.uuid4().hex} a private question about my landlord and the deposit " * 3
    messages = titles.title_messages(question, "Ask for an itemised list of deductions. " * 4)
    await titles.generate_with_engine(engine, messages, 1)
    encoding = encode_segments(engine.tokenizer, messages)
    bs = engine.engine.block_manager.block_size
    instruction = len(encoding.segments[0]) // bs * bs

    async def cached(**options) -> int:
        deltas = [d async for d in engine.stream(encoding.token_ids, SamplingParams(max_tokens=1), **options)]
        return deltas[-1].num_cached_tokens

    assert instruction >= bs
    assert await cached(**cache_options(2, len(encoding.segments[0]))) == instruction  # another user
    assert await cached() == instruction  # unsalted: only the instruction is common
    assert (
        await cached(**cache_options(1, len(encoding.segments[0])))
        == (len(encoding.token_ids) - 1) // bs * bs
    )
