"""The export downloads, the data page (export all, import as a task), and the management
commands, as a user or an operator meets them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from conversations.models import Conversation, DataJob, Message

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def test_a_conversation_downloads_as_json_and_markdown(client, branchy, alice):
    client.force_login(alice)
    response = client.get(f"/conversations/{branchy.pk}/export.json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="trip-{branchy.pk}.json"'
    data = json.loads(response.content)
    assert [c["title"] for c in data["conversations"]] == ["Trip"]
    assert len(data["conversations"][0]["messages"]) == Message.objects.filter(conversation=branchy).count()

    response = client.get(f"/conversations/{branchy.pk}/export.md")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/markdown")
    assert response.content.decode().startswith("# Trip")


def test_another_users_conversation_does_not_download(client, branchy, bob):
    client.force_login(bob)
    assert client.get(f"/conversations/{branchy.pk}/export.json").status_code == 404
    assert client.get(f"/conversations/{branchy.pk}/export.md").status_code == 404
    client.logout()
    assert client.get(f"/conversations/{branchy.pk}/export.json").status_code == 302


def test_the_data_page_has_export_and_import_forms_and_no_inline_script(client, alice):
    client.force_login(alice)
    html = client.get("/settings/data/").content.decode()
    assert 'action="/settings/data/export/"' in html and 'action="/settings/data/import/"' in html
    assert 'enctype="multipart/form-data"' in html and "/static/css/data.css" in html
    assert "<script" not in html and "onclick" not in html and "<style" not in html
    assert 'name="viewport"' in html  # phone width: the page's CSS wraps every row


def test_a_small_export_downloads_at_once(client, branchy, alice):
    client.force_login(alice)
    response = client.post("/settings/data/export/", {"format": "markdown"})
    assert response.status_code == 200 and response.content.decode().startswith("# Trip")
    assert not DataJob.objects.exists()


def test_a_large_export_runs_as_a_task_and_the_page_offers_it_when_ready(
    client, branchy, alice, bob, settings, eager_tasks, django_capture_on_commit_callbacks
):
    settings.EXPORT_INLINE_MAX_MESSAGES = 1
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):  # delay_on_commit
        response = client.post("/settings/data/export/", {"format": "json"})
    assert response.status_code == 302 and response["Location"] == "/settings/data/"
    job = DataJob.objects.get()
    assert (job.kind, job.status, job.conversations) == ("export", "done", 1)
    page = client.get("/settings/data/").content.decode()
    assert f"/settings/data/jobs/{job.pk}/download/" in page and "http-equiv" not in page
    download = client.get(f"/settings/data/jobs/{job.pk}/download/")
    assert json.loads(download.content)["conversations"][0]["title"] == "Trip"

    client.force_login(bob)
    assert client.get(f"/settings/data/jobs/{job.pk}/download/").status_code == 404


def test_an_unfinished_job_makes_the_page_reload_itself(client, alice):
    DataJob.objects.create(owner=alice, kind="export", format="json")
    client.force_login(alice)
    page = client.get("/settings/data/").content.decode()
    assert '<meta http-equiv="refresh"' in page and "Working…" in page


def test_an_upload_imports_as_a_task(client, alice, eager_tasks, django_capture_on_commit_callbacks):
    client.force_login(alice)
    upload = SimpleUploadedFile("conversations.json", (FIXTURES / "chatgpt_branches.json").read_bytes())
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/settings/data/import/", {"file": upload})
    assert response.status_code == 302
    job = DataJob.objects.get()
    assert (job.status, job.format, job.conversations, job.messages, job.payload) == (
        "done",
        "chatgpt",
        2,
        8,
        None,
    )
    assert Conversation.objects.filter(owner=alice).count() == 2
    page = " ".join(client.get("/settings/data/").content.decode().split())
    assert "Imported 2 conversations, 8 messages from ChatGPT." in page


def test_a_hostile_upload_fails_with_a_clear_error_and_saves_nothing(
    client, alice, eager_tasks, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    cyclic = [{"title": "x", "mapping": {"a": {"parent": "b"}, "b": {"parent": "a"}}}]
    upload = SimpleUploadedFile("conversations.json", json.dumps(cyclic).encode())
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/settings/data/import/", {"file": upload})
    job = DataJob.objects.get()
    assert job.status == "failed" and "Nothing was imported" in job.error and "cycle" in job.error
    assert not Conversation.all_objects.exists()
    assert "the parent links form a cycle" in client.get("/settings/data/").content.decode()


def test_an_upload_over_the_cap_is_refused_without_a_job(client, alice, settings):
    settings.IMPORT_MAX_BYTES = 10
    client.force_login(alice)
    upload = SimpleUploadedFile("big.json", b"[" + b" " * 100 + b"]")
    page = client.post("/settings/data/import/", {"file": upload}, follow=True).content.decode()
    assert "larger than" in page and not DataJob.objects.exists()


def test_the_commands_export_and_import_from_the_shell(branchy, alice, bob, tmp_path):
    out = io.StringIO()
    call_command("export_conversations", "alice", "--conversation", str(branchy.pk), stdout=out)
    path = tmp_path / "export.json"
    path.write_text(out.getvalue())
    assert json.loads(out.getvalue())["conversations"][0]["title"] == "Trip"

    out = io.StringIO()
    call_command("import_conversations", "bob", str(path), stdout=out)
    assert out.getvalue().strip() == "Imported 1 conversation(s), 7 message(s) from a chatsite file for bob."
    assert Conversation.objects.get(owner=bob).title == "Trip"

    markdown = io.StringIO()
    call_command("export_conversations", "alice", "--format", "markdown", stdout=markdown)
    assert markdown.getvalue().startswith("# Trip")


def test_the_commands_refuse_bad_input(branchy, bob, tmp_path):
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        call_command("export_conversations", "nobody")
    with pytest.raises(CommandError, match=f"bob has no conversation {branchy.pk}"):
        call_command("export_conversations", "bob", "--conversation", str(branchy.pk))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "chatsite.conversations", "version": 1, "conversations": [{"messages": 3}]}')
    with pytest.raises(CommandError, match="nothing was imported: conversation 1: messages: expected a list"):
        call_command("import_conversations", "bob", str(bad))
    assert not Conversation.objects.filter(owner=bob).exists()


def test_a_bad_file_exits_non_zero_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "manage.py", "import_conversations", "alice", str(bad)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"CommandError: {bad}: nothing was imported: the file is nested too deeply to be a conversation export"
    ]


def test_a_redelivered_import_task_does_nothing_the_second_time(alice):
    from conversations.transfer import jobs as data_jobs

    job = DataJob.objects.create(
        owner=alice, kind="import", payload=(FIXTURES / "chatgpt_branches.json").read_bytes()
    )
    data_jobs.run_import(job.pk)
    data_jobs.run_import(job.pk)  # as after a worker died before acknowledging it
    job.refresh_from_db()
    assert (job.status, job.conversations) == ("done", 2)
    assert Conversation.objects.filter(owner=alice).count() == 2
