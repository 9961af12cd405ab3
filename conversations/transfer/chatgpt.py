"""ChatGPT's ``conversations.json``: a list of conversations, each a ``mapping`` of node id to
``{id, message, parent, children}``, and a ``current_node`` (the leaf shown).

Only user and assistant messages with text become messages here. The rest (the empty root,
hidden system messages, tool calls, images) is skipped, and the children of a skipped node
hang from its nearest kept ancestor, so every branch keeps its shape. The first visible
system message becomes the conversation's system prompt.
"""

from __future__ import annotations

from typing import Any

from conversations.transfer.specs import ConversationSpec, NodeSpec
from conversations.transfer.validate import need, optional, parents_first, timestamp

KEPT_ROLES = {"user", "assistant"}


def looks_like(data: Any) -> bool:
    if isinstance(data, dict):
        return isinstance(data.get("mapping"), dict)
    return isinstance(data, list) and all(isinstance(c, dict) and "mapping" in c for c in data)


def message_text(message: dict, where: str) -> str:
    content = optional(message.get("content"), dict, f"{where}: content") or {}
    parts = optional(content.get("parts"), list, f"{where}: content.parts")
    if parts is not None:
        # Images and files are objects among the parts; only the text is kept.
        return "\n".join(p for p in parts if isinstance(p, str))
    text = content.get("text")
    return text if isinstance(text, str) else ""


def parse(data: Any) -> list[ConversationSpec]:
    items = [data] if isinstance(data, dict) else data
    return [_conversation(i, c) for i, c in enumerate(items)]


def _conversation(index: int, raw: Any) -> ConversationSpec:
    raw = need(raw, dict, f"conversation {index + 1}")
    title = optional(raw.get("title"), str, f"conversation {index + 1}: title") or ""
    where = f"conversation {index + 1}" + (f" ({title[:40]!r})" if title else "")
    mapping = need(raw.get("mapping"), dict, f"{where}: mapping")
    parents: dict[str, str | None] = {}
    for key, node in mapping.items():
        node = need(node, dict, f"{where}: node {key!r}")
        parents[key] = optional(node.get("parent"), str, f"{where}: node {key!r}: parent")
    order = parents_first(parents, where)

    system_prompt = ""
    kept: dict[str, NodeSpec] = {}
    nearest: dict[str, str | None] = {}  # node id -> itself if kept, else its nearest kept ancestor
    for key in order:
        parent = parents[key]
        above = nearest[parent] if parent is not None else None
        spec = None
        message = optional(mapping[key].get("message"), dict, f"{where}: node {key!r}: message")
        if message is not None:
            at = f"{where}: node {key!r}"
            author = optional(message.get("author"), dict, f"{at}: author") or {}
            role = optional(author.get("role"), str, f"{at}: author.role") or ""
            text = message_text(message, at)
            metadata = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
            hidden = bool(metadata.get("is_visually_hidden_from_conversation"))
            if role == "system" and text.strip() and not hidden and not system_prompt:
                system_prompt = text
            elif role in KEPT_ROLES and text.strip() and not hidden:
                created = timestamp(message.get("create_time"), f"{at}: create_time")
                updated = timestamp(message.get("update_time"), f"{at}: update_time")
                model = metadata.get("model_slug") if isinstance(metadata.get("model_slug"), str) else ""
                spec = NodeSpec(
                    key=key,
                    parent=above,
                    role=role,
                    content=text,
                    fields={"status": "complete", "model_name": model[:200]},
                    created_at=created,
                    updated_at=updated or created,
                )
                kept[key] = spec
        nearest[key] = key if spec is not None else above

    current = optional(raw.get("current_node"), str, f"{where}: current_node")
    leaf = nearest.get(current) if current is not None else None
    return ConversationSpec(
        title=title.strip()[:200] or "Imported chat",
        title_source="imported",
        settings={"system_prompt": system_prompt},
        nodes=list(kept.values()),  # parents first, as ``order`` was
        current_leaf=leaf,
        created_at=timestamp(raw.get("create_time"), f"{where}: create_time"),
        updated_at=timestamp(raw.get("update_time"), f"{where}: update_time"),
    )
