"""Housekeeping jobs as plain functions, and the beat schedule that runs them."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from chatsite.celery import app as celery_app
from conversations.chat import housekeeping
from conversations.chat.answer_rows import stale_after
from conversations.chat.tree import send_message
from conversations.models import ApiRequest, Conversation, DataJob, Message

pytestmark = pytest.mark.django_db


def test_streaming_answers_nobody_touched_lately_become_interrupted(alice):
    conversation = Conversation.objects.create(owner=alice)
    _, orphan = send_message(conversation, "one")
    _, live = send_message(conversation, "two")
    long_ago = timezone.now() - timedelta(seconds=stale_after() + 5)
    Message.objects.filter(pk=orphan.pk).update(updated_at=long_ago)

    assert housekeeping.interrupt_orphan_answers() == 1
    orphan.refresh_from_db()
    live.refresh_from_db()
    assert (orphan.status, orphan.finish_reason) == ("interrupted", "abort")
    assert live.status == "streaming"


def test_deleted_conversations_are_purged_after_the_retention_period(alice, settings):
    settings.DELETED_CONVERSATION_RETENTION_DAYS = 30
    old, recent, kept = (Conversation.objects.create(owner=alice) for _ in range(3))
    for conversation in (old, recent, kept):
        send_message(conversation, "hello")
    Conversation.objects.filter(pk=old.pk).update(deleted_at=timezone.now() - timedelta(days=31))
    Conversation.objects.filter(pk=recent.pk).update(deleted_at=timezone.now() - timedelta(days=1))

    assert housekeeping.purge_deleted_conversations() == 1
    assert set(Conversation.all_objects.values_list("pk", flat=True)) == {recent.pk, kept.pk}
    assert not Message.objects.filter(conversation_id=old.pk).exists()
    assert set(Conversation.objects.values_list("pk", flat=True)) == {kept.pk}  # recent is still hidden


def test_api_request_logs_older_than_the_retention_period_are_pruned(alice, settings):
    settings.API_REQUEST_RETENTION_DAYS = 7
    old = ApiRequest.objects.create(owner=alice, endpoint="chat.completions")
    new = ApiRequest.objects.create(owner=alice, endpoint="chat.completions")
    ApiRequest.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    assert housekeeping.prune_api_requests() == 1
    assert list(ApiRequest.objects.values_list("pk", flat=True)) == [new.pk]


def test_expired_sessions_and_old_data_jobs_are_cleared(alice, settings):
    expired, current = SessionStore(), SessionStore()
    expired.set_expiry(-10)
    expired.save()
    current.save()
    housekeeping.clear_expired_sessions()
    assert list(Session.objects.values_list("session_key", flat=True)) == [current.session_key]

    settings.DATA_JOB_RETENTION_HOURS = 24
    stale = DataJob.objects.create(owner=alice, kind="export")
    fresh = DataJob.objects.create(owner=alice, kind="export")
    DataJob.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=25))
    assert housekeeping.prune_data_jobs() == 1
    assert list(DataJob.objects.values_list("pk", flat=True)) == [fresh.pk]


def test_the_beat_schedule_runs_every_housekeeping_task_with_its_period(settings):
    import conversations.tasks  # noqa: F401  (registers the tasks)

    schedule = settings.CELERY_BEAT_SCHEDULE
    assert {entry["task"] for entry in schedule.values()} == {
        "conversations.tasks.interrupt_orphan_answers",
        "conversations.tasks.purge_deleted_conversations",
        "conversations.tasks.purge_temporary_conversations",
        "conversations.tasks.prune_api_requests",
        "conversations.tasks.prune_audit_log",
        "conversations.tasks.prune_data_jobs",
        "conversations.tasks.clear_expired_sessions",
    }
    for entry in schedule.values():
        assert entry["task"] in celery_app.tasks
    assert schedule["interrupt-orphan-answers"]["schedule"] == settings.ORPHAN_SWEEP_SECONDS
    assert schedule["clear-expired-sessions"]["schedule"] == settings.SESSION_SWEEP_SECONDS
    assert schedule["purge-temporary-conversations"]["schedule"] == settings.TEMPORARY_CHAT_SWEEP_SECONDS


# --- KV purge: a user's blocks leave the engine with their data ---------------------------------


def cached_tokens(user_id: int, prompt: list[int]) -> int:
    """What the chat's and API's requests of ``user_id`` get from the prefix cache for ``prompt``."""
    from conversations.chat.cache_salt import cache_options
    from conversations.ops.engine_handle import get_engine
    from inference import SamplingParams

    engine = get_engine()

    async def run() -> int:
        deltas = [
            d async for d in engine.stream(prompt, SamplingParams(max_tokens=1), **cache_options(user_id))
        ]
        return deltas[-1].num_cached_tokens

    return asyncio.run(run())


def warm_prefixes(*users) -> tuple[list[int], int]:
    """The same private-looking prompt cached for each user; returns it and its full hit."""
    from conversations.ops.engine_handle import get_engine

    engine = get_engine()
    prompt = engine.tokenizer.encode(f"{uuid.uuid4().hex} the tenancy dispute and my deposit " * 6)
    bs = engine.engine.block_manager.block_size
    for user in users:
        cached_tokens(user.pk, prompt)
        assert cached_tokens(user.pk, prompt) == (len(prompt) - 1) // bs * bs
    return prompt, (len(prompt) - 1) // bs * bs


@pytest.mark.usefixtures("tiny_engine")
def test_purging_deleted_conversations_drops_their_owners_kv_blocks_and_keeps_others(
    alice, bob, settings, django_capture_on_commit_callbacks
):
    settings.PREFIX_CACHE_SALT = True
    prompt, full = warm_prefixes(alice, bob)
    conversation = Conversation.objects.create(owner=alice)
    send_message(conversation, "hello")
    Conversation.objects.filter(pk=conversation.pk).update(deleted_at=timezone.now() - timedelta(days=31))
    with django_capture_on_commit_callbacks(execute=True):
        assert housekeeping.purge_deleted_conversations() == 1
    assert cached_tokens(alice.pk, prompt) == 0
    assert cached_tokens(bob.pk, prompt) == full


@pytest.mark.usefixtures("tiny_engine")
def test_deleting_a_user_drops_their_kv_blocks_from_the_engine(
    alice, bob, settings, django_capture_on_commit_callbacks
):
    settings.PREFIX_CACHE_SALT = True
    prompt, full = warm_prefixes(alice, bob)
    bob_id = bob.pk
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        bob.delete()
    assert callbacks  # the purge waits for the deletion to commit
    assert cached_tokens(bob_id, prompt) == 0
    assert cached_tokens(alice.pk, prompt) == full
