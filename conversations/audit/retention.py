"""Retention: entries older than ``AUDIT_RETENTION_DAYS`` are deleted (0 keeps them all).
Run by Celery beat (``conversations.tasks.prune_audit_log``); the sweep logs itself."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.audit.log import Action, record
from conversations.models.audit import AuditEvent


def prune_audit_log() -> int:
    days = settings.AUDIT_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    with transaction.atomic():
        removed = AuditEvent.objects.prune_before(cutoff)
        if removed:
            record(Action.AUDIT_PRUNE, detail={"removed": removed, "before": cutoff.isoformat()})
    return removed
