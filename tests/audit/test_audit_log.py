"""The audit log: each event performed through the site (or the admin) and its entry found;
entries cannot be changed or deleted; the admin's list filters and JSONL export; retention."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone

from conversations.audit.admin import AuditedAdmin, AuditEventAdmin
from conversations.audit.log import Action, record
from conversations.audit.retention import prune_audit_log
from conversations.models import ApiKey, AuditEvent, Conversation, McpServer, Share, TokenQuota
from tests.workspace.conftest import post_json

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-unusual-passphrase-42"


def entries(action: str, **filters) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, **filters).order_by("id"))


def only(action: str, **filters) -> AuditEvent:
    found = entries(action, **filters)
    assert len(found) == 1, (action, [e.as_record() for e in AuditEvent.objects.all()])
    return found[0]


@pytest.fixture
def user(make_user):
    return make_user("alice", PASSWORD)


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


# --- sign-in, sign-out, failed sign-in ------------------------------------------------------


def test_sign_in_sign_out_and_a_failed_sign_in_are_logged_with_the_client_address(user):
    client = Client(REMOTE_ADDR="203.0.113.7")
    assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    failed = only(Action.SIGN_IN_FAILED)
    assert failed.actor_id is None and failed.detail == {"username": "alice"}
    assert failed.address == "203.0.113.7"
    assert "wrong" not in json.dumps(failed.as_record())

    assert client.post("/accounts/login/", {"username": "alice", "password": PASSWORD}).status_code == 302
    signed_in = only(Action.SIGN_IN)
    assert (signed_in.actor_id, signed_in.actor_name, signed_in.address) == (user.pk, "alice", "203.0.113.7")
    assert signed_in.object_type == "auth.user" and signed_in.object_id == str(user.pk)

    assert client.post("/accounts/logout/").status_code == 302
    out = only(Action.SIGN_OUT)
    assert (out.actor_name, out.address) == ("alice", "203.0.113.7")


def test_a_failed_admin_sign_in_is_logged(user):
    Client().post("/admin/login/", {"username": "nobody", "password": "x"})
    assert only(Action.SIGN_IN_FAILED).detail == {"username": "nobody"}


# --- API keys ------------------------------------------------------------------------------------


def test_api_key_creation_and_revocation_on_the_settings_page(user):
    client = Client()
    client.force_login(user)
    assert client.post("/settings/api-keys/", {"name": "laptop"}).status_code == 200
    key = ApiKey.objects.get(owner=user)
    created = only(Action.API_KEY_CREATE)
    assert (created.actor_name, created.object_type, created.object_id) == (
        "alice",
        "conversations.apikey",
        str(key.pk),
    )
    assert key.prefix in created.object_repr

    client.post(f"/settings/api-keys/{key.pk}/revoke/")
    assert only(Action.API_KEY_REVOKE).object_id == str(key.pk)
    client.post(f"/settings/api-keys/{key.pk}/revoke/")  # already revoked: nothing changes, nothing logged
    assert len(entries(Action.API_KEY_REVOKE)) == 1


def test_api_keys_made_and_revoked_in_the_admin_and_by_the_command(user, admin_client):
    admin_client.post("/admin/conversations/apikey/add/", {"owner": user.pk, "name": "ci"})
    key = ApiKey.objects.get(owner=user, name="ci")
    made = only(Action.API_KEY_CREATE)
    assert (made.actor_name, made.object_id, made.detail) == ("root", str(key.pk), {"for": "alice"})

    admin_client.post("/admin/conversations/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]})
    assert only(Action.API_KEY_REVOKE).actor_name == "root"

    call_command("create_api_key", "alice", stdout=open("/dev/null", "w"), stderr=open("/dev/null", "w"))
    by_command = entries(Action.API_KEY_CREATE)[-1]
    assert by_command.actor_id is None and by_command.detail == {"via": "manage.py", "for": "alice"}


# --- shares ------------------------------------------------------------------------------------------


def test_share_creation_and_revocation(user):
    conversation = Conversation.objects.create(owner=user, title="Sums")
    client = Client()
    client.force_login(user)
    assert post_json(client, f"/chat/conversations/{conversation.pk}/share/").status_code == 201
    share = Share.objects.get(owner=user)
    created = only(Action.SHARE_CREATE)
    assert (created.object_id, created.detail) == (str(share.pk), {"conversation": conversation.pk})

    client.post(f"/shares/{share.pk}/revoke/")
    assert only(Action.SHARE_REVOKE).object_id == str(share.pk)


# --- MCP servers, groups, membership, roles -----------------------------------------------------


def test_mcp_server_changes_in_the_admin(admin_client):
    group = Group.objects.create(name="research")
    form = {
        "name": "calc",
        "transport": "builtin",
        "enabled": "on",
        "timeout_seconds": "30",
        "args": "[]",
        "env": "{}",
        "groups": [group.pk],
    }
    assert admin_client.post("/admin/conversations/mcpserver/add/", form).status_code == 302
    server = McpServer.objects.get(name="calc")
    created = only(Action.MCP_SERVER_CREATE)
    assert (created.actor_name, created.object_id) == ("root", str(server.pk))
    access = only(Action.MCP_SERVER_CHANGE)
    assert access.detail == {"access": "add", "of": "auth.group", "ids": [group.pk]}

    form["enabled"] = ""
    admin_client.post(f"/admin/conversations/mcpserver/{server.pk}/change/", {**form, "enabled": ""})
    changed = entries(Action.MCP_SERVER_CHANGE)[-1]
    assert changed.detail["enabled"] is False

    admin_client.post(f"/admin/conversations/mcpserver/{server.pk}/delete/", {"post": "yes"})
    assert only(Action.MCP_SERVER_DELETE).object_repr == "calc"
    assert only(Action.ADMIN_DELETE, object_type="conversations.mcpserver").object_id == str(server.pk)


def test_group_changes_membership_and_roles_in_the_admin(admin_client, user):
    no_access_rows = {"access-TOTAL_FORMS": "0", "access-INITIAL_FORMS": "0"}
    added = admin_client.post("/admin/auth/group/add/", {"name": "staff-readers", **no_access_rows})
    assert added.status_code == 302
    group = Group.objects.get(name="staff-readers")
    assert only(Action.GROUP_CREATE).object_id == str(group.pk)
    admin_client.post(f"/admin/auth/group/{group.pk}/change/", {"name": "readers", **no_access_rows})
    assert only(Action.GROUP_CHANGE).object_repr == "readers"

    form = {
        "username": "alice",
        "is_active": "on",
        "is_staff": "on",
        "groups": [group.pk],
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    response = admin_client.post(f"/admin/auth/user/{user.pk}/change/", form)
    assert response.status_code == 302, response.content[:2000]
    membership = only(Action.GROUP_MEMBERSHIP)
    assert (membership.actor_name, membership.object_id, membership.detail) == (
        "root",
        str(user.pk),
        {"added": ["readers"]},
    )
    role = only(Action.ROLE_CHANGE, object_id=str(user.pk))
    assert role.detail == {"is_staff": True}

    admin_client.post(f"/admin/auth/group/{group.pk}/delete/", {"post": "yes"})
    assert only(Action.GROUP_DELETE).object_repr == "readers"


def test_membership_changed_from_code_is_logged_too(user):
    group = Group.objects.create(name="api")
    user.groups.add(group)
    group.user_set.remove(user)
    added, removed = entries(Action.GROUP_MEMBERSHIP)
    assert added.detail == {"added": ["api"]} and removed.detail == {"removed": ["api"]}


# --- export and import -------------------------------------------------------------------------------


def test_export_and_import_are_logged(user, settings):
    settings.TITLES_FROM_MODEL = False
    conversation = Conversation.objects.create(owner=user, title="Notes")
    client = Client()
    client.force_login(user)
    assert client.get(f"/conversations/{conversation.pk}/export.json").status_code == 200
    one = only(Action.EXPORT)
    assert one.object_id == str(conversation.pk) and one.detail == {"format": "json"}

    assert client.post("/settings/data/export/", {"format": "markdown"}).status_code == 200
    assert entries(Action.EXPORT)[-1].detail == {"format": "markdown", "scope": "all"}

    upload = SimpleUploadedFile("mine.json", b'{"format": "chatsite", "version": 1, "conversations": []}')
    assert client.post("/settings/data/import/", {"file": upload}).status_code == 302
    imported = only(Action.IMPORT)
    assert imported.actor_name == "alice" and imported.detail == {"file": "mine.json"}


# --- admin deletions ----------------------------------------------------------------------------------


def test_admin_deletions_one_and_selected(admin_client, user):
    first = Conversation.objects.create(owner=user, title="first")
    second = Conversation.objects.create(owner=user, title="second")
    third = Conversation.objects.create(owner=user, title="third")
    admin_client.post(f"/admin/conversations/conversation/{first.pk}/delete/", {"post": "yes"})
    assert only(Action.ADMIN_DELETE).object_repr == "first"

    admin_client.post(
        "/admin/conversations/conversation/",
        {"action": "delete_selected", "_selected_action": [second.pk, third.pk], "post": "yes"},
    )
    assert not Conversation.objects.filter(pk__in=[second.pk, third.pk]).exists()
    assert {e.object_repr for e in entries(Action.ADMIN_DELETE)} == {"first", "second", "third"}
    assert {e.actor_name for e in entries(Action.ADMIN_DELETE)} == {"root"}


def test_every_model_admin_logs_its_deletions():
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, AuditedAdmin | AuditEventAdmin), model


# --- append-only, same transaction -------------------------------------------------------------------


def test_entries_cannot_be_changed_or_deleted(user, admin_client):
    entry = record(Action.SIGN_IN, actor=user, target=user)
    entry.object_repr = "tampered"
    with pytest.raises(Exception, match="cannot be changed"):
        entry.save()
    with pytest.raises(Exception, match="cannot be deleted"):
        entry.delete()
    with pytest.raises(Exception, match="cannot be changed"):
        AuditEvent.objects.filter(pk=entry.pk).update(object_repr="tampered")
    with pytest.raises(Exception, match="cannot be deleted"):
        AuditEvent.objects.all().delete()
    with pytest.raises((DatabaseError, IntegrityError), match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE conversations_auditevent SET object_repr = 'tampered'")
    entry.refresh_from_db()
    assert entry.object_repr == "alice"

    # The admin shows entries and nothing more, even to a superuser.
    assert admin_client.get(f"/admin/conversations/auditevent/{entry.pk}/change/").status_code == 200
    admin_client.post(f"/admin/conversations/auditevent/{entry.pk}/change/", {"object_repr": "x"})
    assert (
        admin_client.post(f"/admin/conversations/auditevent/{entry.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert admin_client.get("/admin/conversations/auditevent/add/").status_code == 403
    entry.refresh_from_db()
    assert entry.object_repr == "alice" and AuditEvent.objects.filter(pk=entry.pk).exists()


def test_an_entry_rolls_back_with_its_change(user):
    with pytest.raises(RuntimeError), transaction.atomic():
        Group.objects.create(name="gone")
        raise RuntimeError("the change failed")
    assert not entries(Action.GROUP_CREATE)


# --- the admin's list, JSONL export, retention -------------------------------------------------------


def test_the_list_filters_and_the_jsonl_export_follows_them(admin_client, user):
    record(Action.SIGN_IN, actor=user, target=user)
    record(Action.SIGN_IN_FAILED, detail={"username": "mallory"})
    page = admin_client.get("/admin/conversations/auditevent/", {"action__exact": Action.SIGN_IN_FAILED})
    assert page.status_code == 200
    assert b"failed to sign in" in page.content and b"export.jsonl?action__exact" in page.content

    export = admin_client.get(
        "/admin/conversations/auditevent/export.jsonl", {"action__exact": Action.SIGN_IN_FAILED}
    )
    assert export.status_code == 200 and export["Content-Type"].startswith("application/jsonl")
    lines = [json.loads(line) for line in b"".join(export.streaming_content).splitlines()]
    assert [line["action"] for line in lines] == [Action.SIGN_IN_FAILED]
    assert lines[0]["detail"] == {"username": "mallory"}
    assert only(Action.AUDIT_EXPORT).detail == {"filters": {"action__exact": Action.SIGN_IN_FAILED}}

    assert Client().get("/admin/conversations/auditevent/export.jsonl").status_code == 302  # staff only


def test_retention_removes_entries_past_their_age_and_logs_itself(settings, user):
    old = record(Action.SIGN_IN, actor=user)
    recent = record(Action.SIGN_OUT, actor=user)
    with connection.cursor() as cursor:  # back-dated by a delete and re-insert: no UPDATE passes
        AuditEvent.objects.filter(pk=old.pk)._raw_delete(connection.alias)
        cursor.execute(
            "INSERT INTO conversations_auditevent (id, created_at, actor_id, actor_name, action, object_type,"
            " object_id, object_repr, detail) VALUES (%s, %s, %s, 'alice', %s, '', '', '', '{}')",
            [old.pk, timezone.now() - timedelta(days=400), user.pk, Action.SIGN_IN],
        )
    settings.AUDIT_RETENTION_DAYS = 0
    assert prune_audit_log() == 0
    settings.AUDIT_RETENTION_DAYS = 365
    assert prune_audit_log() == 1
    assert (
        not AuditEvent.objects.filter(pk=old.pk).exists() and AuditEvent.objects.filter(pk=recent.pk).exists()
    )
    assert only(Action.AUDIT_PRUNE).detail["removed"] == 1


# --- quotas ---------------------------------------------------------------------------------------------


def test_quota_changes_in_the_admin_are_logged(admin_client, user):
    form = {"user": user.pk, "completion_tokens_per_day": "500", "cached_prompt_discount": "0.5"}
    assert admin_client.post("/admin/conversations/tokenquota/add/", form).status_code == 302
    quota = TokenQuota.objects.get(user=user)
    created = only(Action.QUOTA_CHANGE)
    assert created.actor_name == "root" and created.object_id == str(quota.pk)
    assert created.detail["created"]["completion_tokens_per_day"] == 500
    admin_client.post(
        f"/admin/conversations/tokenquota/{quota.pk}/change/", {**form, "completion_tokens_per_day": "900"}
    )
    assert entries(Action.QUOTA_CHANGE)[-1].detail["changed"]["completion_tokens_per_day"] == 900


def test_quota_exhaustion_is_logged_when_a_request_is_refused(user):
    from conversations.accounts import quota
    from tests.support.quota_counters import forget_counters

    forget_counters()
    TokenQuota.objects.create(user=user, prompt_tokens_per_day=10)
    quota.admission(user.pk, 6)
    with pytest.raises(quota.Exhausted, match="daily prompt-token quota"):
        quota.admission(user.pk, 6)
    entry = only(Action.QUOTA_EXHAUSTED)
    assert entry.actor_name == "alice" and entry.detail["how"] == "refused" and entry.detail["limit"] == 10
    forget_counters()
