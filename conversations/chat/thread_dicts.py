"""What the browser receives: conversation and message dicts, and the visible thread
(the websocket protocol in docs/interfaces.md). ``tree`` is a ``conversations.chat.tree.Tree``.

Every websocket message must fit one frame of ``WEBSOCKET_MAX_MESSAGE_BYTES`` (Daphne's
limit, 1 MiB by default), whatever the conversation holds. So a tab gets the visible thread
in pages (:func:`thread_page`: the newest messages first, at most ``CHAT_THREAD_PAGE_MESSAGES``
and about a third of a frame; older pages on request), and a message whose text is over an
eighth of a frame is sent with the start of it and ``truncated`` (:func:`fitted`): the page
fetches the whole text over HTTP (``/chat/messages/<id>/text/``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import orjson
from django.conf import settings

from conversations.models import Conversation, Message
from conversations.models.workspace import ratings_for

# A tool call's arguments shown past this are cut (the page shows them as a preview only).
TOOL_ARGUMENTS_SHOWN_CHARS = 4000


def _frame() -> int:
    return int(getattr(settings, "WEBSOCKET_MAX_MESSAGE_BYTES", 1024 * 1024))


def text_limit() -> int:
    """The UTF-8 size of a message's text (content, reasoning) sent whole over the socket."""
    return _frame() // 8


def page_bytes() -> int:
    """About how much of a frame one page of the thread fills (at least one message)."""
    return _frame() // 3


def page_messages() -> int:
    return max(1, int(getattr(settings, "CHAT_THREAD_PAGE_MESSAGES", 100)))


def _cut(text: str, limit: int) -> str | None:
    """``text``'s start within ``limit`` UTF-8 bytes if it is longer, else None."""
    if len(text) * 4 <= limit:
        return None
    raw = text.encode()
    return raw[:limit].decode(errors="ignore") if len(raw) > limit else None


def fitted(data: dict, limit: int | None = None) -> dict:
    """A message dict for the socket: a text over ``limit`` (``text_limit``) is cut to its start
    and named in ``truncated`` (the page fetches the rest); a tool's arguments are cut for show."""
    limit = limit or text_limit()
    truncated = []
    for name in ("content", "reasoning"):
        cut = _cut(data.get(name) or "", limit)
        if cut is not None:
            data[name] = cut
            truncated.append(name)
    if truncated:
        data["truncated"] = truncated
    tool = data.get("tool")
    if tool and len(tool.get("arguments") or "") > TOOL_ARGUMENTS_SHOWN_CHARS:
        data["tool"] = {**tool, "arguments": tool["arguments"][:TOOL_ARGUMENTS_SHOWN_CHARS] + "…"}
    for call in data.get("tool_calls") or ():
        if len(call.get("arguments") or "") > TOOL_ARGUMENTS_SHOWN_CHARS:
            data["tool_calls"] = [
                {**c, "arguments": (c.get("arguments") or "")[:TOOL_ARGUMENTS_SHOWN_CHARS]}
                for c in data["tool_calls"]
            ]
            break
    return data


class Thread(Protocol):
    """What these dicts read of a ``conversations.chat.tree.Tree``."""

    conversation: Conversation

    def siblings(self, message: Message) -> Sequence[Message]: ...

    def thread(self) -> Sequence[Message]: ...

    def side_by_side(self, question: Message) -> Sequence[Message]: ...


def conversation_dict(conversation: Conversation) -> dict:
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "updated_at": conversation.updated_at.isoformat() if conversation.updated_at else None,
        "system_prompt": conversation.system_prompt,
        "temperature": conversation.temperature,
        "top_p": conversation.top_p,
        "top_k": conversation.top_k,
        "max_tokens": conversation.max_tokens,
        "temporary": conversation.temporary,
        "pinned": conversation.pinned,
        "folder_id": conversation.folder_id,
        "archived": conversation.archived_at is not None,
        "tools_enabled": conversation.tools_enabled,
        "tools_approval": conversation.tools_approval,
        "model": conversation.model,
    }


def message_dict(message: Message, tree: Thread | None = None) -> dict:
    data = {
        "id": message.pk,
        "parent_id": message.parent_id,
        "role": message.role,
        "content": message.content,
        "reasoning": message.reasoning,
        "reasoning_seconds": message.reasoning_seconds,
        "status": message.status,
        "finish_reason": message.finish_reason,
        "error": message.error,
        "prompt_tokens": message.prompt_tokens,
        "completion_tokens": message.completion_tokens,
        "cached_tokens": message.cached_tokens,
        "context_dropped": message.context_dropped,
        "time_to_first_token_ms": message.time_to_first_token_ms,
        "tokens_per_s": message.tokens_per_s,
        "model": message.model_name,
        "created_at": message.created_at.isoformat() if message.created_at else None,
        **tool_dict(message),
    }
    if tree is not None:
        siblings = tree.siblings(message)
        data["siblings"] = [m.pk for m in siblings]
        data["sibling_index"] = next(i for i, m in enumerate(siblings) if m.pk == message.pk)
    return data


def tool_dict(message: Message) -> dict:
    """An answer's ``tool_calls``; a tool result's call (``tool``: id, name, arguments,
    duration_ms, is_error, approval). Absent on other messages."""
    if message.tool_calls:
        return {"tool_calls": message.tool_calls}
    if message.role != Message.Role.TOOL:
        return {}
    return {
        "tool": {
            "call_id": message.tool_call_id,
            "name": message.tool_name,
            "arguments": message.tool_arguments,
            "duration_ms": message.tool_duration_ms,
            "is_error": message.tool_is_error,
            "approval": message.tool_approval,
        }
    }


def side_by_side_fields(message: Message, shown: Message | None, tree: Thread) -> dict:
    """On a question whose answers a side-by-side send started together and that awaits the
    user's choice (``Tree.side_by_side``), where the thread goes on through one of them
    (``shown``): ``side_by_side``, the group's answer ids in column order, and ``beside``, the
    dicts of the others (each text within a quarter of ``text_limit``, so that the question,
    its shown answer and its group fit one frame together). Otherwise nothing."""
    group = tree.side_by_side(message) if shown is not None else ()
    if shown not in group:
        return {}
    limit = text_limit() // 4
    return {
        "side_by_side": [m.pk for m in group],
        "beside": [fitted(message_dict(m, tree), limit) for m in group if m.pk != shown.pk],
    }


def every_message(messages: Sequence[dict]) -> Iterator[dict]:
    """The message dicts of a thread or page, with the ``beside`` answers of their questions."""
    for message in messages:
        yield message
        yield from message.get("beside", ())


def _entries(path: Sequence[Message], tree: Thread, rated: dict) -> Iterator[dict]:
    """The dicts of ``path``, newest first (not fitted)."""
    for index in range(len(path) - 1, -1, -1):
        message = path[index]
        shown = path[index + 1] if index + 1 < len(path) else None
        group = side_by_side_fields(message, shown, tree)
        yield message_dict(message, tree) | {"rating": rated.get(message.pk)} | group


def thread_page(path: Sequence[Message], tree: Thread) -> tuple[list[dict], int]:
    """The newest page of ``path`` (oldest first, as the socket sends it: fitted), and how
    many older messages of the path it leaves out."""
    candidates = path[-page_messages() :]
    rated = ratings_for(
        [
            m.pk
            for m in candidates
            if m.role == Message.Role.ASSISTANT and m.status != Message.Status.STREAMING
        ]
    )
    budget, size, page = page_bytes(), 0, []
    for data in _entries(candidates, tree, rated):
        data = fitted(data)
        cost = len(orjson.dumps(data))
        # A question whose side-by-side answers the page shows comes with them, over budget or not.
        if page and size + cost > budget and "side_by_side" not in data:
            break
        page.append(data)
        size += cost
    page.reverse()
    return page, len(path) - len(page)


def thread_dict(tree: Thread, *, paged: bool = False) -> dict:
    """The visible thread: whole (the HTTP view), or ``paged`` for a socket (its newest page,
    ``earlier`` saying how many older messages there are to ask for)."""
    thread = tree.thread()
    if paged:
        messages, earlier = thread_page(thread, tree)
        return {
            "conversation": conversation_dict(tree.conversation),
            "messages": messages,
            "earlier": earlier,
        }
    # Only a finished answer can be rated: a thread ending in a new one asks nothing.
    rated = ratings_for(
        [m.pk for m in thread if m.role == Message.Role.ASSISTANT and m.status != Message.Status.STREAMING]
    )
    return {
        "conversation": conversation_dict(tree.conversation),
        "messages": list(_entries(thread, tree, rated))[::-1],
    }
