"""Writing checked conversations, batch by batch.

Each batch (a few hundred conversations, or a few thousand messages) is one short
transaction of bulk statements, so an import of thousands of conversations never holds
the database's write lock (on SQLite, the whole file's) for more than a moment, and the
job can show how far it got. A failure part way removes what the import had written: a
file is imported whole or not at all, as the data page says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.transfer import workspace_fields
from conversations.transfer.specs import ConversationSpec

log = logging.getLogger(__name__)

# A batch closes at whichever comes first; one conversation is never split (a reader would
# see half a tree), so a single huge conversation is a batch of its own.
BATCH_CONVERSATIONS = 100
BATCH_MESSAGES = 2_000
REMOVE_CHUNK = 500

# Called after each batch commits with (conversations written, messages written).
OnBatch = Callable[[int, int], None]
# A batch's spec, its conversation and its messages, built before its transaction.
Rows = list[tuple[ConversationSpec, Conversation, list[Message]]]


class ImportStopped(Exception):
    """Writing failed part way and what was written could not be removed either."""

    def __init__(self, kept: int) -> None:
        super().__init__(f"{kept} conversation(s) were written before the import failed and were kept")
        self.kept = kept


def save(
    owner,
    specs: list[ConversationSpec],
    on_batch: OnBatch | None = None,
    guard: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> list[int]:
    """Create the conversations (all or none, batch by batch); returns their ids. Each
    batch's writes run inside ``guard()`` (a shutdown may cut them short there); removing
    what was written after a failure does not."""
    now = timezone.now()
    ids: list[int] = []
    messages = 0
    try:
        for batch in _batches(specs):
            rows = _prepare(owner, batch)  # outside the transaction: it holds no lock
            with guard(), transaction.atomic():
                ids.extend(_write(rows, now))
            messages += sum(len(s.nodes) for s in batch)
            if on_batch is not None:
                on_batch(len(ids), messages)
    except Exception as exc:
        if not _remove_after_failure(ids):
            raise ImportStopped(len(ids)) from exc
        raise
    except BaseException:  # a worker shutting down: still try not to leave half a file
        _remove_after_failure(ids)
        raise
    return ids


def _batches(specs: list[ConversationSpec]) -> Iterator[list[ConversationSpec]]:
    batch: list[ConversationSpec] = []
    size = 0
    for spec in specs:
        if batch and (len(batch) >= BATCH_CONVERSATIONS or size + len(spec.nodes) > BATCH_MESSAGES):
            yield batch
            batch, size = [], 0
        batch.append(spec)
        size += len(spec.nodes)
    if batch:
        yield batch


def _prepare(owner, batch: list[ConversationSpec]) -> Rows:
    rows = []
    for spec in batch:
        conversation = Conversation(
            owner=owner, title=spec.title, title_source=spec.title_source, **spec.settings
        )
        made = [
            Message(conversation=conversation, role=n.role, content=n.content, **n.fields) for n in spec.nodes
        ]
        rows.append((spec, conversation, made))
    return rows


def _write(rows: Rows, now: datetime) -> list[int]:
    conversations = [conversation for _, conversation, _ in rows]
    owner = conversations[0].owner if conversations else None
    workspace_fields.place(owner, [(spec.workspace, conversation) for spec, conversation, _ in rows])
    # Both supported databases return the new ids from a bulk insert (SQLite >= 3.35); the
    # messages made before then pick their conversation's id up as they are inserted.
    Conversation.objects.bulk_create(conversations)
    Message.objects.bulk_create([m for _, _, made in rows for m in made], batch_size=500)
    workspace_fields.save_ratings(
        [(n.rating, m) for spec, _, made in rows for n, m in zip(spec.nodes, made, strict=True)]
    )
    # Rows first, in bulk, then their links in one executemany: the same few statements
    # whatever the trees' shapes (Django's bulk_update builds a CASE per row and is slow).
    links, heads = [], []
    for spec, conversation, made in rows:
        by_key = {n.key: m.pk for n, m in zip(spec.nodes, made, strict=True)}
        active, root = _shown_thread(spec)
        for node in spec.nodes:
            created = node.created_at or now
            child = active.get(node.key)
            links.append(
                (
                    by_key[node.parent] if node.parent is not None else None,
                    by_key[child] if child is not None else None,
                    created,
                    node.updated_at or created,
                    by_key[node.key],
                )
            )
        leaf = by_key[spec.current_leaf] if spec.current_leaf is not None else None
        heads.append(
            (
                leaf,
                by_key[root] if root is not None else None,
                spec.created_at or now,
                spec.updated_at or now,
                conversation.pk,
            )
        )
    _update(Message, ("parent", "active_child", "created_at", "updated_at"), links)
    _update(Conversation, ("current_leaf", "active_root", "created_at", "updated_at"), heads)
    return [c.pk for c in conversations]


def _shown_thread(spec: ConversationSpec) -> tuple[dict, object]:
    """Each node's active child, and the root to show. A file that names no active children
    (ChatGPT's) gets them along the path to its current leaf, as selecting that leaf would."""
    active = {n.key: n.active_child for n in spec.nodes if n.active_child is not None}
    if spec.current_leaf is None or active:
        return active, spec.active_root
    parent_of = {n.key: n.parent for n in spec.nodes}
    child = spec.current_leaf
    while parent_of[child] is not None:
        active[parent_of[child]] = child
        child = parent_of[child]
    return active, child


def _update(model, names: tuple[str, ...], rows: list[tuple]) -> None:
    """``UPDATE model SET names... WHERE id = ...`` for each row (the id last), in one executemany."""
    if not rows:
        return
    fields = [model._meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    sql = f"UPDATE {quote(model._meta.db_table)} SET {assignments} WHERE id = %s"
    stamps = [i for i, f in enumerate(fields) if f.get_internal_type() == "DateTimeField"]
    prepared = []
    for row in rows:
        values = list(row)
        for i in stamps:
            values[i] = fields[i].get_db_prep_value(values[i], connection)
        prepared.append(values)
    with connection.cursor() as cursor:
        cursor.executemany(sql, prepared)


def _remove_after_failure(ids: list[int]) -> bool:
    """Delete the conversations an import wrote before it failed; False if that fails too."""
    try:
        for start in range(0, len(ids), REMOVE_CHUNK):
            chunk = ids[start : start + REMOVE_CHUNK]
            with transaction.atomic():
                # Links first, so the delete need not walk the trees.
                Conversation.all_objects.filter(pk__in=chunk).update(current_leaf=None, active_root=None)
                Message.objects.filter(conversation_id__in=chunk).update(parent=None, active_child=None)
                Message.objects.filter(conversation_id__in=chunk).order_by().delete()
                Conversation.all_objects.filter(pk__in=chunk).delete()
    except Exception:
        log.exception("could not remove the %d conversation(s) of a failed import", len(ids))
        return False
    return True
