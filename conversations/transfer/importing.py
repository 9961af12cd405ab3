"""Import: our JSON export or ChatGPT's ``conversations.json``, told apart by shape.

The whole file is parsed and checked before anything is written
(:mod:`~conversations.transfer.saving` then writes it in batches): a malformed or hostile
file (wrong shape, a cycle in the parent links, a missing parent, too big, too many
conversations or messages, nested too deeply) saves nothing and raises
:class:`~conversations.transfer.validate.InvalidFile` with one line saying why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from conversations.models import Conversation, Message
from conversations.transfer import chatgpt, workspace_fields
from conversations.transfer.exporting import FORMAT, OPTIONAL_MESSAGE_FIELDS, VERSION, optional_message_fields
from conversations.transfer.saving import OnBatch, save
from conversations.transfer.specs import ConversationSpec, NodeSpec
from conversations.transfer.validate import InvalidFile, need, number, optional, parents_first, timestamp

ROLES = set(Message.Role.values)
STATUSES = set(Message.Status.values)


@dataclass
class ImportResult:
    format: str  # "ours" | "chatgpt"
    conversation_ids: list[int]
    messages: int


def parse_file(raw: bytes) -> tuple[str, list[ConversationSpec]]:
    """Check and parse a whole file; returns its format and the conversations in it."""
    limit = settings.IMPORT_MAX_BYTES
    if len(raw) > limit:
        raise InvalidFile(f"the file is {len(raw):,} bytes; the limit is {limit:,}")
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise InvalidFile("the file is not UTF-8 text") from None
    except RecursionError:
        raise InvalidFile("the file is nested too deeply to be a conversation export") from None
    except ValueError as exc:
        raise InvalidFile(f"the file is not valid JSON ({exc})") from None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        _check_count(data.get("conversations"))
        specs = _ours(data)
        kind = "ours"
    elif chatgpt.looks_like(data):
        _check_count(data)
        specs = chatgpt.parse(data)
        kind = "chatgpt"
    else:
        raise InvalidFile(
            "this is neither a chatsite export nor ChatGPT's conversations.json "
            f'(expected an object with "format": "{FORMAT}" or a list of conversations with a "mapping")'
        )
    if not specs:
        raise InvalidFile("the file holds no conversations")
    total = sum(len(s.nodes) for s in specs)
    if total > settings.IMPORT_MAX_MESSAGES:
        raise InvalidFile(f"the file holds {total:,} messages; the limit is {settings.IMPORT_MAX_MESSAGES:,}")
    return kind, specs


def _check_count(conversations: Any) -> None:
    # Counted before any conversation is looked at: a small file can list a great many empty
    # ones, each of which would cost rows and time.
    count = len(conversations) if isinstance(conversations, list) else 1
    limit = settings.IMPORT_MAX_CONVERSATIONS
    if count > limit:
        raise InvalidFile(f"the file holds {count:,} conversations; the limit is {limit:,}")


def import_bytes(owner, raw: bytes, on_batch: OnBatch | None = None) -> ImportResult:
    kind, specs = parse_file(raw)
    account = account_fields(raw) if kind == "ours" else {}
    ids = save(owner, specs, on_batch)
    workspace_fields.save_account_fields(owner, account)
    return ImportResult(format=kind, conversation_ids=ids, messages=sum(len(s.nodes) for s in specs))


# --- Our format ---------------------------------------------------------------------


def _ours(data: dict) -> list[ConversationSpec]:
    version = data.get("version")
    if version != VERSION:
        raise InvalidFile(f"unsupported export version {version!r} (this site reads version {VERSION})")
    conversations = need(data.get("conversations"), list, "conversations")
    return [_our_conversation(i, c) for i, c in enumerate(conversations)]


def _our_conversation(index: int, raw: Any) -> ConversationSpec:
    where = f"conversation {index + 1}"
    raw = need(raw, dict, where)
    messages = need(raw.get("messages", []), list, f"{where}: messages")
    nodes: dict[Any, NodeSpec] = {}
    for position, item in enumerate(messages):
        at = f"{where}, message {position + 1}"
        item = need(item, dict, at)
        key = need(item.get("id"), (int, str), f"{at}: id")
        if key in nodes:
            raise InvalidFile(f"{at}: the id {key!r} is used twice")
        role = need(item.get("role"), str, f"{at}: role")
        if role not in ROLES:
            raise InvalidFile(f"{at}: unknown role {role!r}")
        status = need(item.get("status", "complete"), str, f"{at}: status")
        if status not in STATUSES:
            raise InvalidFile(f"{at}: unknown status {status!r}")
        if status == Message.Status.STREAMING:
            status = Message.Status.INTERRUPTED  # nothing generates it here
        fields = {
            "status": status,
            "finish_reason": need(item.get("finish_reason") or "", str, f"{at}: finish_reason")[:16],
            "error": need(item.get("error") or "", str, f"{at}: error"),
            "model_name": need(item.get("model") or "", str, f"{at}: model")[:200],
            "time_to_first_token_ms": number(
                item.get("time_to_first_token_ms"), f"{at}: time_to_first_token_ms"
            ),
            "tokens_per_s": number(item.get("tokens_per_s"), f"{at}: tokens_per_s"),
        }
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "context_dropped"):
            fields[name] = need(item.get(name) or 0, int, f"{at}: {name}")
        for name in optional_message_fields():
            kind = OPTIONAL_MESSAGE_FIELDS[name]
            if item.get(name) is not None:
                if kind is float:
                    fields[name] = number(item[name], f"{at}: {name}")
                elif name == "tool_calls":
                    fields[name] = _tool_calls(item[name], f"{at}: {name}")
                else:
                    fields[name] = need(item[name], kind, f"{at}: {name}")
        for name, size in {"tool_call_id": 64, "tool_name": 128, "tool_approval": 16}.items():
            if name in fields:
                fields[name] = fields[name][:size]
        nodes[key] = NodeSpec(
            key=key,
            parent=optional(item.get("parent"), (int, str), f"{at}: parent"),
            role=role,
            content=need(item.get("content", ""), str, f"{at}: content"),
            fields=fields,
            created_at=timestamp(item.get("created_at"), f"{at}: created_at"),
            updated_at=timestamp(item.get("updated_at"), f"{at}: updated_at"),
            active_child=item.get("active_child"),
            rating=workspace_fields.parse_rating(item, at) if role == Message.Role.ASSISTANT else None,
        )
    order = parents_first({k: n.parent for k, n in nodes.items()}, where)
    for node in nodes.values():  # a pointer that is not a child is dropped, not trusted
        child = nodes.get(node.active_child) if isinstance(node.active_child, (int, str)) else None
        node.active_child = child.key if child is not None and child.parent == node.key else None
    current_leaf = raw.get("current_leaf")
    active_root = raw.get("active_root")
    title_source = raw.get("title_source")
    return ConversationSpec(
        title=need(raw.get("title") or "Imported chat", str, f"{where}: title").strip()[:200]
        or "Imported chat",
        title_source=title_source if title_source in Conversation.TitleSource.values else "imported",
        settings=_our_settings(raw, where),
        nodes=[nodes[k] for k in order],
        current_leaf=current_leaf if isinstance(current_leaf, (int, str)) and current_leaf in nodes else None,
        active_root=active_root
        if isinstance(active_root, (int, str)) and active_root in nodes and nodes[active_root].parent is None
        else None,
        created_at=timestamp(raw.get("created_at"), f"{where}: created_at"),
        updated_at=timestamp(raw.get("updated_at"), f"{where}: updated_at"),
        workspace=workspace_fields.parse_conversation_fields(raw, where),
    )


def account_fields(raw: bytes) -> dict:
    """The folders and presets of our file (already read whole and checked by parse_file)."""
    return workspace_fields.parse_account_fields(json.loads(raw.decode("utf-8-sig")))


def _tool_calls(value: Any, where: str) -> list[dict]:
    """An answer's calls: a list of ``{"id", "name", "arguments"}``, all text."""
    calls = []
    for i, call in enumerate(need(value, list, where)):
        call = need(call, dict, f"{where} {i + 1}")
        calls.append(
            {key: need(call.get(key), str, f"{where} {i + 1}: {key}") for key in ("id", "name", "arguments")}
        )
    return calls


def _our_settings(raw: dict, where: str) -> dict:
    result = {"system_prompt": need(raw.get("system_prompt") or "", str, f"{where}: system_prompt")}
    # A model this site does not serve is kept all the same: the chat falls back to the default.
    result["model"] = need(raw.get("model") or "", str, f"{where}: model")[:200]
    for name in ("tools_enabled", "tools_approval"):
        if raw.get(name) is not None:
            result[name] = need(raw[name], bool, f"{where}: {name}")
    bounds = {"temperature": (0.0, 2.0), "top_p": (0.01, 1.0)}
    for name, (low, high) in bounds.items():
        value = number(raw.get(name), f"{where}: {name}")
        if value is not None:
            result[name] = min(max(value, low), high)
    for name, (low, high) in {"top_k": (0, 1000), "max_tokens": (1, 32_768)}.items():
        value = optional(raw.get(name), int, f"{where}: {name}")
        if value is not None:
            result[name] = min(max(value, low), high)
    return result
