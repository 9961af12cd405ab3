"""Search over one user's own conversations, for the built-in server's ``search_conversations``.

The user is never an argument the model can set: the built-in server is started for one
user (``CHATSITE_TOOLS_USER_ID``, set by the site) and every query here is filtered by that
owner first, so no text of another user can come back."""

from __future__ import annotations

from conversations.models import Conversation, Message

MAX_RESULTS = 10
SNIPPET_CHARS = 200


def search_conversations(user_id: int, query: str, limit: int = 5) -> list[dict]:
    """Messages of ``user_id``'s live, kept (not temporary) conversations whose text contains ``query`` (case
    insensitive), newest first: conversation id and title, role, and a snippet around the match."""
    query = (query or "").strip()
    if not query:
        return []
    limit = max(1, min(int(limit), MAX_RESULTS))
    # A temporary chat is never searched: its text must not reach a kept conversation.
    owned = Conversation.objects.filter(owner_id=int(user_id), temporary=False).values("pk")
    rows = (
        Message.objects.filter(conversation__in=owned, content__icontains=query)
        .exclude(role=Message.Role.TOOL)  # earlier tool output is not the user's conversation
        .select_related("conversation")
        .order_by("-created_at", "-id")[:limit]
    )
    return [
        {
            "conversation_id": m.conversation_id,
            "title": m.conversation.title,
            "role": m.role,
            "snippet": _snippet(m.content, query),
        }
        for m in rows
    ]


def _snippet(text: str, query: str) -> str:
    at = text.lower().find(query.lower())
    start = max(0, at - SNIPPET_CHARS // 2)
    piece = text[start : start + SNIPPET_CHARS]
    return ("…" if start else "") + piece + ("…" if start + SNIPPET_CHARS < len(text) else "")
