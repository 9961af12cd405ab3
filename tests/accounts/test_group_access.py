"""Groups decide access: the API (403 on /v1), models, sharing and public sharing, document
caps; a user's rights are the union of their groups' rows, the site's defaults without any."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from conversations.accounts.access import access_for
from conversations.documents.formats import DocumentError
from conversations.documents.jobs import check_caps
from conversations.models import ApiKey, AuditEvent, Conversation, GroupAccess, Share
from tests.support.api_engine import serve_in_process
from tests.workspace.conftest import post_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake_engine(monkeypatch):
    """Calls that get past authentication meet an engine serving the model "tiny"."""
    engine = SimpleNamespace(model_name="tiny", max_model_len=2048)

    serve_in_process(monkeypatch, engine)
    return engine


def in_group(user, name: str, **access) -> Group:
    group, _ = Group.objects.get_or_create(name=name)
    if access:
        GroupAccess.objects.update_or_create(group=group, defaults=access)
    user.groups.add(group)
    return group


def models_call(raw: str, path: str = "/v1/models"):
    return Client().get(path, HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.mark.smoke
def test_a_user_in_a_group_without_api_access_gets_403_on_v1(make_user, fake_engine):
    user = make_user("dana")
    _key, raw = ApiKey.objects.create_key(user)
    assert models_call(raw).status_code == 200  # no groups: the site's defaults
    in_group(user, "no-api", api=False)
    response = models_call(raw)
    assert response.status_code == 403
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "api_access_denied")
    assert Client().get("/v1/models/tiny", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 403
    # Another group that grants the API: rights add up.
    in_group(user, "api", api=True)
    assert models_call(raw).status_code == 200


def test_a_group_limited_to_other_models_gets_403_for_the_served_one(make_user, fake_engine):
    user = make_user("erin")
    _key, raw = ApiKey.objects.create_key(user)
    in_group(user, "big-models-only", allowed_models=["big"])
    assert models_call(raw).json()["data"] == []
    response = models_call(raw, "/v1/models/tiny")
    assert response.status_code == 403 and response.json()["error"]["code"] == "model_access_denied"
    in_group(user, "tiny-users", allowed_models=["tiny"])
    assert [m["id"] for m in models_call(raw).json()["data"]] == ["tiny"]


def test_groups_without_an_access_row_add_nothing(make_user):
    user = make_user("fay")
    in_group(user, "plain")
    in_group(user, "locked", api=False, sharing=False, public_sharing=False)
    access = access_for(user.pk)
    assert (access.api, access.sharing, access.public_sharing) == (False, False, False)


def test_sharing_and_public_sharing_follow_the_groups(make_user, settings):
    settings.ALLOW_PUBLIC_SHARES = True
    user = make_user("gus")
    conversation = Conversation.objects.create(owner=user, title="Notes")
    client = Client()
    client.force_login(user)
    group = in_group(user, "no-sharing", sharing=False)
    assert post_json(client, f"/chat/conversations/{conversation.pk}/share/").status_code == 403
    assert not Share.objects.exists()

    GroupAccess.objects.filter(group=group).update(sharing=True, public_sharing=False)
    created = post_json(client, f"/chat/conversations/{conversation.pk}/share/")
    assert created.status_code == 201
    path = created.json()["share"]["url"].removeprefix("http://testserver")
    assert Client().get(path).status_code == 302  # anonymous: sign in first
    assert client.get(path).status_code == 200  # signed in: readable
    GroupAccess.objects.filter(group=group).update(public_sharing=True)
    assert Client().get(path).status_code == 200


def test_document_caps_are_the_largest_of_the_groups(make_user, settings):
    settings.DOCUMENT_USER_MAX_BYTES = 1000
    user = make_user("hal")
    check_caps(user, "a.txt", 900)
    in_group(user, "small", document_max_bytes=100)
    with pytest.raises(DocumentError, match="the limit is 100"):
        check_caps(user, "a.txt", 200)
    in_group(user, "large", document_max_bytes=5000)
    check_caps(user, "a.txt", 4000)


def test_changing_a_groups_access_is_audited(make_user):
    group = Group.objects.create(name="auditors")
    GroupAccess.objects.create(group=group, api=False)
    entry = AuditEvent.objects.filter(action="group.change", object_id=str(group.pk)).get()
    assert entry.detail["access"]["api"] is False
