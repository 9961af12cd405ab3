"""Thumbs up or down on an answer, with an optional reason (JSON, from the chat page)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from conversations.models import Message, Rating
from conversations.workspace.http import bad_request, conversation_changed, json_body, login_required_json

REASON_MAX_CHARS = 1000


@require_POST
@login_required_json
def rate(request: HttpRequest, pk: int) -> JsonResponse:
    """``{value: 1 | -1 | 0, reason?}`` on one of the user's finished answers; 0 removes it."""
    message = (
        Message.objects.defer("token_ids")
        .filter(
            pk=pk,
            conversation__owner=request.user,
            conversation__deleted_at__isnull=True,
            conversation__temporary=False,  # never kept, so never rated (nor exported)
            role=Message.Role.ASSISTANT,
        )
        .first()
    )
    if message is None:
        return JsonResponse({"detail": "no such answer among your kept conversations"}, status=404)
    if message.status == Message.Status.STREAMING:
        return bad_request("this answer is still being written")
    data = json_body(request)
    value, reason = data.get("value"), data.get("reason", "")
    if value not in (1, -1, 0) or isinstance(value, bool):
        return bad_request("value must be 1 (thumbs up), -1 (thumbs down) or 0 (no rating)")
    if not isinstance(reason, str) or len(reason) > REASON_MAX_CHARS:
        return bad_request(f"reason must be text of at most {REASON_MAX_CHARS} characters")
    if value == 0:
        Rating.objects.filter(message=message).delete()
        rating = None
    else:
        Rating.objects.update_or_create(message=message, defaults={"value": value, "reason": reason.strip()})
        rating = {"value": value, "reason": reason.strip()}
    conversation_changed(message.conversation_id)
    return JsonResponse({"message_id": message.pk, "rating": rating})
