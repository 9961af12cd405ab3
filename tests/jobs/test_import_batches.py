"""Imports write batch by batch: each batch commits on its own (another connection sees it at
once), the job counts its progress up to the file's total, and a failure part way removes
what the import wrote."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import OperationalError, connections

from conversations.chat.tree import Tree
from conversations.models import Conversation, DataJob, Message
from conversations.transfer import jobs as data_jobs
from conversations.transfer import saving

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.django_db(transaction=True)


def from_another_connection(query):
    """What a second connection (another request, another process) sees now."""

    def run():
        try:
            return query()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def five_conversations() -> bytes:
    conversations = [
        {
            "title": f"chat {i}",
            "current_leaf": 2,
            "messages": [
                {"id": 1, "role": "user", "content": f"question {i}"},
                {"id": 2, "parent": 1, "role": "assistant", "content": f"answer {i}"},
            ],
        }
        for i in range(5)
    ]
    return json.dumps(
        {"format": "chatsite.conversations", "version": 1, "conversations": conversations}
    ).encode()


def import_job(owner, raw: bytes) -> DataJob:
    return DataJob.objects.create(owner=owner, kind=DataJob.Kind.IMPORT, filename="chats.json", payload=raw)


def test_an_import_commits_batch_by_batch_and_counts_its_progress(alice, monkeypatch):
    monkeypatch.setattr(saving, "BATCH_CONVERSATIONS", 2)
    job = import_job(alice, five_conversations())
    seen = []
    real_save = data_jobs.save

    def watched_save(owner, specs, on_batch, **kwargs):
        def after_batch(conversations, messages):
            on_batch(conversations, messages)
            seen.append(
                from_another_connection(
                    lambda: (
                        Conversation.objects.filter(owner=alice).count(),
                        DataJob.objects.values_list("conversations", "messages", "total").get(pk=job.pk),
                    )
                )
            )

        return real_save(owner, specs, on_batch=after_batch, **kwargs)

    monkeypatch.setattr(data_jobs, "save", watched_save)
    data_jobs.run_import(job.pk)
    assert seen == [(2, (2, 4, 5)), (4, (4, 8, 5)), (5, (5, 10, 5))]
    job.refresh_from_db()
    assert (job.status, job.conversations, job.messages, job.total, job.payload) == ("done", 5, 10, 5, None)
    first = Conversation.objects.get(title="chat 0")
    assert [m.content for m in Tree.load(first).thread()] == ["question 0", "answer 0"]


def test_a_batch_closes_at_its_message_budget_but_never_splits_a_conversation(monkeypatch):
    from conversations.transfer.specs import ConversationSpec, NodeSpec

    monkeypatch.setattr(saving, "BATCH_MESSAGES", 3)

    def spec(size: int) -> ConversationSpec:
        nodes = [NodeSpec(key=i, parent=i - 1 if i else None, role="user", content="") for i in range(size)]
        return ConversationSpec(title="t", title_source="imported", settings={}, nodes=nodes)

    sizes = [[len(s.nodes) for s in batch] for batch in saving._batches([spec(2), spec(1), spec(5), spec(1)])]
    assert sizes == [[2, 1], [5], [1]]


def test_a_running_import_shows_its_progress_on_the_data_page(client, alice):
    DataJob.objects.create(owner=alice, kind="import", status="running", total=10_000, conversations=4_200)
    client.force_login(alice)
    page = " ".join(client.get("/settings/data/").content.decode().split())
    assert "Importing… 4200 of 10000 conversations" in page and '<meta http-equiv="refresh"' in page


def fail_on_third_batch(monkeypatch):
    monkeypatch.setattr(saving, "BATCH_CONVERSATIONS", 2)
    real_write = saving._write
    calls = []

    def write(rows, now):
        calls.append(len(rows))
        if len(calls) == 3:
            raise OperationalError("disk I/O error")
        return real_write(rows, now)

    monkeypatch.setattr(saving, "_write", write)


def test_an_import_that_fails_part_way_removes_what_it_wrote(alice, monkeypatch):
    kept = Conversation.objects.create(owner=alice, title="mine already")
    fail_on_third_batch(monkeypatch)
    job = import_job(alice, five_conversations())
    data_jobs.run_import(job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.conversations == 0
    assert job.error == "Nothing was imported: the import failed (OperationalError)."
    assert list(Conversation.all_objects.values_list("pk", flat=True)) == [kept.pk]
    assert not Message.objects.exists()


def test_an_import_that_cannot_remove_what_it_wrote_says_how_much_was_kept(alice, monkeypatch):
    fail_on_third_batch(monkeypatch)
    monkeypatch.setattr(saving, "_remove_after_failure", lambda ids: False)  # the database went away
    job = import_job(alice, five_conversations())
    data_jobs.run_import(job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.conversations == 4
    assert job.error == "The import failed (OperationalError) after 4 conversations; those were kept."
    assert Conversation.objects.filter(owner=alice).count() == 4
