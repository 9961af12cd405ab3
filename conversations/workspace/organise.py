"""Pins, one level of folders, the archive and bulk actions on the user's conversations.

JSON in and out; a conversation or folder id that is not the user's is a 404 (one),
or is left out of a bulk action (many). Every change makes the user's tabs reload
their conversation list.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from conversations.models import Conversation, Folder
from conversations.models.workspace import FOLDER_NAME_LENGTH
from conversations.workspace.http import (
    bad_request,
    conversation_gone,
    json_body,
    list_changed,
    login_required_json,
)

BULK_LIMIT = 500
BULK_ACTIONS = ("archive", "restore", "delete", "move", "pin", "unpin")


def folder_dict(folder: Folder) -> dict:
    return {"id": folder.pk, "name": folder.name}


def folders_of(user) -> list[dict]:
    return [folder_dict(f) for f in Folder.objects.filter(owner=user)]


def _folder_name(data: dict) -> str | None:
    name = data.get("name")
    if not isinstance(name, str):
        return None
    name = " ".join(name.split())
    return name if 0 < len(name) <= FOLDER_NAME_LENGTH else None


def _folder_or_none(user, folder_id) -> tuple[bool, Folder | None]:
    """(valid, folder): ``None`` is "no folder"; an id that is not the user's is invalid."""
    if folder_id is None:
        return True, None
    try:
        return True, Folder.objects.get(pk=int(folder_id), owner=user)
    except (Folder.DoesNotExist, TypeError, ValueError):
        return False, None


@require_GET
@login_required_json
@never_cache
def folder_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"folders": folders_of(request.user)})


@require_POST
@login_required_json
def folder_create(request: HttpRequest) -> JsonResponse:
    name = _folder_name(json_body(request))
    if name is None:
        return bad_request(f"a folder needs a name of 1 to {FOLDER_NAME_LENGTH} characters")
    try:
        with transaction.atomic():
            folder = Folder.objects.create(owner=request.user, name=name)
    except IntegrityError:
        return bad_request(f"you already have a folder named “{name}”")
    list_changed(request.user.pk)
    return JsonResponse({"folder": folder_dict(folder)}, status=201)


@require_POST
@login_required_json
def folder_rename(request: HttpRequest, pk: int) -> JsonResponse:
    folder = get_object_or_404(Folder, pk=pk, owner=request.user)
    name = _folder_name(json_body(request))
    if name is None:
        return bad_request(f"a folder needs a name of 1 to {FOLDER_NAME_LENGTH} characters")
    if Folder.objects.filter(owner=request.user, name=name).exclude(pk=pk).exists():
        return bad_request(f"you already have a folder named “{name}”")
    folder.name = name
    folder.save(update_fields=["name"])
    list_changed(request.user.pk)
    return JsonResponse({"folder": folder_dict(folder)})


@require_POST
@login_required_json
def folder_delete(request: HttpRequest, pk: int) -> JsonResponse:
    """The folder goes; its conversations stay, out of any folder."""
    folder = get_object_or_404(Folder, pk=pk, owner=request.user)
    folder.delete()
    list_changed(request.user.pk)
    return JsonResponse({"deleted": pk})


def _apply(conversations, action: str, folder: Folder | None) -> int:
    """One bulk action on a queryset of the user's conversations; returns how many changed."""
    now = timezone.now()
    if action == "archive":
        return conversations.update(archived_at=now, pinned=False)
    if action == "restore":
        return conversations.update(archived_at=None)
    if action == "move":
        return conversations.update(folder=folder)
    if action in ("pin", "unpin"):
        return conversations.update(pinned=action == "pin")
    ids = list(conversations.values_list("pk", flat=True))
    Conversation.objects.filter(pk__in=ids).update(deleted_at=now)
    for pk in ids:
        conversation_gone(pk)
    return len(ids)


@require_POST
@login_required_json
def organise(request: HttpRequest, pk: int) -> JsonResponse:
    """``{pinned?, folder_id?, archived?}``: any subset, for one conversation."""
    conversation = get_object_or_404(Conversation, pk=pk, owner=request.user, temporary=False)
    data = json_body(request)
    if "folder_id" in data:
        valid, folder = _folder_or_none(request.user, data["folder_id"])
        if not valid:
            return bad_request("no such folder")
        conversation.folder = folder
    if "pinned" in data:
        conversation.pinned = bool(data["pinned"])
    if "archived" in data:
        conversation.archived_at = timezone.now() if data["archived"] else None
        if data["archived"]:
            conversation.pinned = False
    # A queryset update: the sidebar's order (updated_at) is not about organising.
    Conversation.objects.filter(pk=pk).update(
        folder=conversation.folder, pinned=conversation.pinned, archived_at=conversation.archived_at
    )
    list_changed(request.user.pk)
    return JsonResponse({"conversation": placement(conversation)})


def placement(conversation: Conversation) -> dict:
    return {
        "id": conversation.pk,
        "pinned": conversation.pinned,
        "folder_id": conversation.folder_id,
        "archived": conversation.archived_at is not None,
    }


@require_POST
@login_required_json
def bulk(request: HttpRequest) -> JsonResponse:
    """``{ids, action, folder_id?}``: archive, restore, delete, move (to ``folder_id``, or
    out of any folder with null), pin or unpin several conversations at once."""
    data = json_body(request)
    action, ids = data.get("action"), data.get("ids")
    if action not in BULK_ACTIONS:
        return bad_request(f"action must be one of {', '.join(BULK_ACTIONS)}")
    if not isinstance(ids, list) or not ids or len(ids) > BULK_LIMIT:
        return bad_request(f"ids must list 1 to {BULK_LIMIT} conversations")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return bad_request("ids must be numbers")
    valid, folder = _folder_or_none(request.user, data.get("folder_id"))
    if action == "move" and not valid:
        return bad_request("no such folder")
    conversations = Conversation.objects.filter(owner=request.user, pk__in=ids, temporary=False)
    changed = _apply(conversations, action, folder)
    list_changed(request.user.pk)
    return JsonResponse({"action": action, "changed": changed})
