"""Export: our JSON format (every branch, statuses, timings, sampling settings) and Markdown.

JSON layout (``format`` and ``version`` identify it on import)::

    {"format": "chatsite.conversations", "version": 1, "exported_at": "...",
     "conversations": [{"id", "title", "title_source", "created_at", "updated_at",
                        "system_prompt", "temperature", "top_p", "top_k", "max_tokens",
                        "tools_enabled", "tools_approval", "model", "current_leaf", "active_root",
                        "messages": [{"id", "parent", "active_child", "role", "content", "status",
                                      "finish_reason", "error", "prompt_tokens", "completion_tokens",
                                      "cached_tokens", "context_dropped", "model",
                                      "time_to_first_token_ms", "tokens_per_s",
                                      "created_at", "updated_at", "reasoning",
                                      "reasoning_seconds", "tool_calls", "tool_call_id",
                                      "tool_name", "tool_arguments", "tool_duration_ms",
                                      "tool_is_error", "tool_approval"}, ...]}]}

Role ``tool`` messages are the results of an answer's ``tool_calls`` (``[{"id", "name",
"arguments"}]``), each under the call before it.

Messages are listed parents first. Ids are the site's own and only link the records of one
file together; an import gives new ones. Token ids are left out: they belong to one model's
tokenizer and are rebuilt from the text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from django.utils import timezone

from conversations.chat.tree import Tree
from conversations.models import Conversation, Message
from conversations.transfer import workspace_fields

FORMAT = "chatsite.conversations"
VERSION = 1

SETTINGS_FIELDS = (
    "system_prompt",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "tools_enabled",
    "tools_approval",
    "model",
)
CONVERSATION_FIELDS = ("title", "title_source", *SETTINGS_FIELDS)
MESSAGE_FIELDS = (
    "role",
    "content",
    "status",
    "finish_reason",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "context_dropped",
    "time_to_first_token_ms",
    "tokens_per_s",
)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def parents_first(tree: Tree) -> Iterator[Message]:
    """Every message of the tree, each after its parent (breadth first, oldest sibling first)."""
    queue = list(tree.roots())
    at = 0
    while at < len(queue):
        node = queue[at]
        at += 1
        yield node
        queue.extend(tree.children.get(node.pk, []))


# Tool calls and results (conversations.chat.tool_loop): an answer's calls, a result's call.
TOOL_MESSAGE_FIELDS = {
    "tool_calls": list,
    "tool_call_id": str,
    "tool_name": str,
    "tool_arguments": str,
    "tool_duration_ms": float,
    "tool_is_error": bool,
    "tool_approval": str,
}

# Reasoning (the reasoning contract in docs/interfaces.md): exported and imported when the model has these fields.
OPTIONAL_MESSAGE_FIELDS = {"reasoning": str, "reasoning_seconds": float, **TOOL_MESSAGE_FIELDS}


def optional_message_fields() -> list[str]:
    present = {f.name for f in Message._meta.get_fields()}
    return [name for name in OPTIONAL_MESSAGE_FIELDS if name in present]


def message_record(message: Message) -> dict:
    record = {"id": message.pk, "parent": message.parent_id, "active_child": message.active_child_id}
    record.update({name: getattr(message, name) for name in MESSAGE_FIELDS})
    record.update({name: getattr(message, name) for name in optional_message_fields()})
    record["model"] = message.model_name
    record["created_at"] = _iso(message.created_at)
    record["updated_at"] = _iso(message.updated_at)
    return record


def conversation_record(conversation: Conversation) -> dict:
    tree = Tree.load(conversation)
    record = {"id": conversation.pk}
    record.update({name: getattr(conversation, name) for name in CONVERSATION_FIELDS})
    record.update(workspace_fields.conversation_fields(conversation))
    messages = [message_record(m) for m in parents_first(tree)]
    ratings = workspace_fields.message_ratings([m["id"] for m in messages])
    for message in messages:
        if message["id"] in ratings:
            message["rating"] = ratings[message["id"]]
    record.update(
        created_at=_iso(conversation.created_at),
        updated_at=_iso(conversation.updated_at),
        current_leaf=conversation.current_leaf_id,
        active_root=conversation.active_root_id,
        messages=messages,
    )
    return record


def export_json(conversations: Iterable[Conversation], owner=None) -> dict:
    """The file; with ``owner``, also their folders and prompt presets (a whole-account export)."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": timezone.now().isoformat(),
        "conversations": [conversation_record(c) for c in conversations],
    }
    if owner is not None:
        data.update(workspace_fields.account_fields(owner))
    return data


def render_json(data: dict) -> bytes:
    return json.dumps(data, ensure_ascii=False, indent=1).encode()


ROLE_HEADINGS = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}


def _markdown_one(conversation: Conversation) -> str:
    tree = Tree.load(conversation)
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["## System", "", conversation.system_prompt.strip(), ""]
    for message in tree.thread():
        heading = ROLE_HEADINGS.get(message.role, message.role.title())
        if message.status != Message.Status.COMPLETE:
            heading += f" ({message.status})"
        if message.role == Message.Role.ASSISTANT and message.model_name:
            heading += f" · {message.model_name}"
        lines += [f"## {heading}", "", message.content.strip() or "*(empty)*", ""]
    return "\n".join(lines)


def export_markdown(conversations: Iterable[Conversation]) -> str:
    """The thread each conversation shows, one after the other."""
    return "\n---\n\n".join(_markdown_one(c) for c in conversations)
