"""A live answer's database rows: its inputs, its partial saves, the fence.

Each step is synchronous Django ORM code; the async ones are wrapped with
``conversations.ops.db_thread.db_call`` for the generation manager's tasks.

**The fence.** A process writes an answer's row only while it owns it: ``owner_process`` is
this process and the status is still ``streaming`` (:func:`update_message` checks both in
the UPDATE itself). A process that was taken for dead (paused past the registry's expiry)
may find its answers failed over by another process, or an answer it never claimed taken
back by the tab's process: then its writes match no row, and it stops that answer.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from conversations.chat.thread_dicts import fitted, message_dict
from conversations.cluster.registry import PROCESS_ID
from conversations.models import Message
from conversations.ops.db_thread import db_call
from conversations.prepared_queries import PreparedUpdate

# A streaming row is touched at least this often even without new text.
HEARTBEAT_SECONDS = 10.0


def stale_after() -> float:
    """Seconds after which an untouched ``streaming`` row counts as orphaned."""
    return max(60.0, 10 * settings.PARTIAL_SAVE_SECONDS, 2 * HEARTBEAT_SECONDS)


_owned = PreparedUpdate(
    lambda message_id, owner: Message.objects.filter(
        pk=message_id, owner_process=owner, status=Message.Status.STREAMING
    )
)


@db_call
def update_message(message_id: int, **fields: object) -> int:
    """Write a live answer's row if this process still owns it (the fence); 0 if not (it
    was failed over, taken back, finished or deleted)."""
    fields.setdefault("updated_at", timezone.now())
    return _owned(message_id, PROCESS_ID, **fields)


def _write_owned(message_id: int, fields: dict[str, object], now: datetime) -> int:
    """One live answer's row behind the fence, touched at ``now`` (unless ``fields`` say)."""
    return _owned(message_id, PROCESS_ID, **{"updated_at": now, **fields})


@db_call
def save_partials(rows: list[tuple[int, dict[str, object]]]) -> set[int]:
    """Write several live answers' rows, ``(message id, fields)``, in one transaction, each
    behind the fence; the ids of those this process no longer owns (nothing written)."""
    now = timezone.now()
    with transaction.atomic():
        return {message_id for message_id, fields in rows if not _write_owned(message_id, fields, now)}


@db_call
def save_finals(rows: list[tuple[int, dict[str, object]]]) -> list[int | Exception]:
    """Several answers' final saves, ``(message id, fields)``, each behind the fence, in one
    transaction: per row, the rows it wrote (0: fenced). Should that transaction fail, each
    row is written in one of its own, and a row that fails alone gets its error."""
    now = timezone.now()
    try:
        with transaction.atomic():
            return [_write_owned(message_id, fields, now) for message_id, fields in rows]
    except Exception:
        if len(rows) == 1:
            raise
    results: list[int | Exception] = []
    for message_id, fields in rows:
        try:
            with transaction.atomic():
                results.append(_write_owned(message_id, fields, now))
        except Exception as exc:
            results.append(exc)
    return results


@db_call
def owned_answers(message_ids: list[int]) -> set[int]:
    """Those of ``message_ids`` whose rows this process still owns."""
    return set(
        Message.objects.filter(
            pk__in=message_ids, owner_process=PROCESS_ID, status=Message.Status.STREAMING
        ).values_list("pk", flat=True)
    )


@db_call
def take_over(message_id: int, previous_owner: str) -> bool:
    """Make this process the owner of a live answer, if ``previous_owner`` still owns it."""
    return bool(_owned(message_id, previous_owner, owner_process=PROCESS_ID, updated_at=timezone.now()))


@db_call
def stored_message(message_id: int) -> dict | None:
    """The row as stored, as the tabs get it (fitted to a frame); None if it is gone."""
    message = Message.objects.defer("token_ids").filter(pk=message_id).first()
    return None if message is None else fitted(message_dict(message))


@db_call
def store_user_segment(message_id: int, ids: list[int], fingerprint: str) -> None:
    """Store a user message's segment unless it holds one made by the same tokenizer."""
    unusable = Q(token_ids__isnull=True) | ~Q(token_fingerprint=fingerprint)
    Message.objects.filter(unusable, pk=message_id).update(token_ids=ids, token_fingerprint=fingerprint)
