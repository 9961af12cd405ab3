"""Starting a conversation from the chat page (a preset's settings, or a temporary chat),
closing a temporary one, and what the page needs of the workspace when it loads."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.decorators.http import require_POST

from conversations.chat import tree as tree_ops
from conversations.models import Conversation
from conversations.workspace.http import conversation_gone, login_required_json
from conversations.workspace.organise import folders_of
from conversations.workspace.presets import preset_dict, preset_settings, presets_for


def start_conversation(user, options: dict) -> Conversation:
    """A conversation for the first message: temporary when asked, with the settings of the
    preset ``preset_id`` when one is named (the user's own or a site-wide one)."""
    chosen = preset_settings(user, options.get("preset_id")) if options.get("preset_id") else None
    if options.get("temporary") is True:
        return Conversation.objects.create(owner=user, temporary=True, **(chosen or {}))
    conversation = tree_ops.ensure_empty_conversation(user)
    if chosen:
        for name, value in chosen.items():
            setattr(conversation, name, value)
        conversation.save(update_fields=list(chosen))
    return conversation


@require_POST
@login_required_json
def close_temporary(request: HttpRequest, pk: int) -> JsonResponse:
    """The tab left a temporary chat: it is hidden now and purged by the next housekeeping run
    (``purge_temporary_conversations``). Other conversations are left alone."""
    conversation = get_object_or_404(Conversation, pk=pk, owner=request.user)
    if not conversation.temporary:
        return JsonResponse({"closed": False})
    Conversation.objects.filter(pk=pk).update(deleted_at=timezone.now())
    conversation_gone(pk)
    return JsonResponse({"closed": True})


def page_state(request: HttpRequest) -> dict:
    """The workspace's part of the chat page's boot state."""
    return {
        "folders": folders_of(request.user),
        "presets": [preset_dict(p) for p in presets_for(request.user)],
        "allow_public_shares": settings.ALLOW_PUBLIC_SHARES,
    }
