"""What the browser receives: conversation and message dicts, and the visible thread
(the websocket protocol in docs/interfaces.md). ``tree`` is a ``conversations.chat.tree.Tree``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conversations.models import Conversation, Message
from conversations.models.workspace import ratings_for


class Thread(Protocol):
    """What these dicts read of a ``conversations.chat.tree.Tree``."""

    conversation: Conversation

    def siblings(self, message: Message) -> Sequence[Message]: ...

    def thread(self) -> Sequence[Message]: ...


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


def thread_dict(tree: Thread) -> dict:
    thread = tree.thread()
    # Only a finished answer can be rated: a thread ending in a new one asks nothing.
    rated = ratings_for(
        [m.pk for m in thread if m.role == Message.Role.ASSISTANT and m.status != Message.Status.STREAMING]
    )
    return {
        "conversation": conversation_dict(tree.conversation),
        "messages": [message_dict(m, tree) | {"rating": rated.get(m.pk)} for m in thread],
    }
