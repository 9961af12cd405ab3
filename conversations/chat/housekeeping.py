"""The site cleaning up after itself; each function is one scheduled job (see
``CELERY_BEAT_SCHEDULE`` in the settings) and returns how many rows it changed."""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from conversations.chat import lifecycle
from conversations.chat.answer_rows import stale_after
from conversations.chat.groups import broadcast, conversation_group
from conversations.chat.kv_purge import purge_user_kv
from conversations.models import ApiRequest, Conversation, DataJob, Message


def interrupt_orphan_answers() -> int:
    """``streaming`` answers whose row nobody has touched for :func:`stale_after` seconds.

    A live generation touches its row every few seconds (the partial saver), in whichever
    process owns it, so an untouched one has no live owner: its process died."""
    return lifecycle.interrupt_stale(timezone.now() - timedelta(seconds=stale_after()))


def purge_conversation(pk: int) -> None:
    """Delete a conversation and its messages for good."""
    with transaction.atomic():
        # Messages first, in one statement, so the cascade need not walk a deep tree.
        Conversation.all_objects.filter(pk=pk).update(current_leaf=None, active_root=None)
        Message.objects.filter(conversation_id=pk).update(active_child=None)
        Message.objects.filter(conversation_id=pk).order_by().delete()
        Conversation.all_objects.filter(pk=pk).delete()


def purge_deleted_conversations() -> int:
    """Conversations deleted more than ``DELETED_CONVERSATION_RETENTION_DAYS`` ago, and
    their owners' KV blocks in every engine (the engine knows blocks by user, not by
    conversation: those users' other prefixes are recomputed on their next turn)."""
    cutoff = timezone.now() - timedelta(days=settings.DELETED_CONVERSATION_RETENTION_DAYS)
    doomed = list(Conversation.all_objects.filter(deleted_at__lt=cutoff).values_list("pk", "owner_id"))
    for pk, _owner in doomed:
        purge_conversation(pk)
    for owner_id in sorted({owner for _pk, owner in doomed}):
        purge_user_kv(owner_id)
    return len(doomed)


def purge_temporary_conversations() -> int:
    """Temporary chats their tab closed, and those older than ``TEMPORARY_CHAT_MAX_AGE_SECONDS``
    whatever their state, with their owners' KV blocks (as for deleted conversations). A tab
    still showing one is told it is gone."""
    cutoff = timezone.now() - timedelta(seconds=settings.TEMPORARY_CHAT_MAX_AGE_SECONDS)
    doomed = list(
        Conversation.all_objects.filter(temporary=True)
        .filter(Q(deleted_at__isnull=False) | Q(created_at__lt=cutoff))
        .values_list("pk", "owner_id")
    )
    for pk, _owner in doomed:
        async_to_sync(broadcast)(conversation_group(pk), "deleted", conversation_id=pk)
        purge_conversation(pk)
    for owner_id in sorted({owner for _pk, owner in doomed}):
        purge_user_kv(owner_id)
    return len(doomed)


def prune_api_requests() -> int:
    """API request logs older than ``API_REQUEST_RETENTION_DAYS``."""
    cutoff = timezone.now() - timedelta(days=settings.API_REQUEST_RETENTION_DAYS)
    deleted, _ = ApiRequest.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def prune_data_jobs() -> int:
    """Export files and import records older than ``DATA_JOB_RETENTION_HOURS``."""
    cutoff = timezone.now() - timedelta(hours=settings.DATA_JOB_RETENTION_HOURS)
    deleted, _ = DataJob.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def clear_expired_sessions() -> None:
    """What ``manage.py clearsessions`` does, for the configured session engine."""
    engine = import_module(settings.SESSION_ENGINE)
    engine.SessionStore.clear_expired()
