"""What the workspace's JSON views share: the sign-in check, the body, and telling tabs."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.http import JsonResponse

from conversations.chat.groups import broadcast, conversation_group, user_group
from conversations.chat.json_guard import json_body, login_required_json  # noqa: F401 - shared by the views


def bad_request(detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=400)


def list_changed(user_id: int) -> None:
    """Every tab of the user fetches its conversation list again."""
    async_to_sync(broadcast)(user_group(user_id), "conversations")


def conversation_changed(conversation_id: int) -> None:
    """Every tab showing the conversation receives its thread again."""
    async_to_sync(broadcast)(conversation_group(conversation_id), "settings")


def conversation_gone(conversation_id: int) -> None:
    """Open sockets stop the conversation's answers and tell their tabs it is gone."""
    async_to_sync(broadcast)(conversation_group(conversation_id), "deleted", conversation_id=conversation_id)
