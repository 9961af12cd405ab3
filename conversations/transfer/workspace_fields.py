"""The workspace's fields in our export and import: a conversation's pin, archive date and
folder (by name), each answer's rating, and the account's folders and prompt presets.

In a file (all optional, so older files still import)::

    conversation: {"pinned": bool, "archived_at": "<iso>" | null, "folder": "<name>" | null, ...}
    message:      {"rating": {"value": 1 | -1, "reason": "..."} | absent, ...}
    top level:    {"folders": ["<name>", ...],
                   "presets": [{"name", "system_prompt", "temperature", "top_p", "top_k", "max_tokens"}]}

An import puts conversations into the user's folder of that name (made if missing) and
adds presets whose name the user does not have yet.
"""

from __future__ import annotations

from typing import Any

from conversations.models import Conversation, Folder, Message, Preset, Rating
from conversations.models.workspace import FOLDER_NAME_LENGTH
from conversations.transfer.validate import InvalidFile, need, number, optional, timestamp

PRESET_NUMBERS = {"temperature": (0.0, 2.0), "top_p": (0.01, 1.0)}
PRESET_INTEGERS = {"top_k": (0, 1000), "max_tokens": (1, 32_768)}


# --- Export -------------------------------------------------------------------------


def conversation_fields(conversation: Conversation) -> dict:
    return {
        "pinned": conversation.pinned,
        "archived_at": conversation.archived_at.isoformat() if conversation.archived_at else None,
        "folder": conversation.folder.name if conversation.folder_id else None,
    }


def message_ratings(message_ids: list[int]) -> dict[int, dict]:
    rows = Rating.objects.filter(message_id__in=message_ids).values_list("message_id", "value", "reason")
    return {mid: {"value": value, "reason": reason} for mid, value, reason in rows}


def account_fields(owner) -> dict:
    presets = Preset.objects.filter(owner=owner).values(
        "name", "system_prompt", "temperature", "top_p", "top_k", "max_tokens"
    )
    return {
        "folders": list(Folder.objects.filter(owner=owner).values_list("name", flat=True)),
        "presets": list(presets),
    }


# --- Import: checking -----------------------------------------------------------------


def _folder_name(value: Any, where: str) -> str | None:
    name = optional(value, str, where)
    if name is None:
        return None
    name = " ".join(name.split())[:FOLDER_NAME_LENGTH]
    return name or None


def parse_conversation_fields(raw: dict, where: str) -> dict:
    return {
        "pinned": bool(optional(raw.get("pinned"), bool, f"{where}: pinned")),
        "archived_at": timestamp(raw.get("archived_at"), f"{where}: archived_at"),
        "folder": _folder_name(raw.get("folder"), f"{where}: folder"),
    }


def parse_rating(item: dict, at: str) -> dict | None:
    rating = optional(item.get("rating"), dict, f"{at}: rating")
    if rating is None:
        return None
    value = need(rating.get("value"), int, f"{at}: rating value")
    if value not in (1, -1):
        raise InvalidFile(f"{at}: a rating's value is 1 or -1, not {value}")
    reason = need(rating.get("reason") or "", str, f"{at}: rating reason")[:1000]
    return {"value": value, "reason": reason}


def _clamp(value, low, high):
    return None if value is None else min(max(value, low), high)


def parse_account_fields(data: dict) -> dict:
    folders = [_folder_name(n, "folders") for n in need(data.get("folders") or [], list, "folders")]
    presets = []
    for i, raw in enumerate(need(data.get("presets") or [], list, "presets")):
        where = f"preset {i + 1}"
        raw = need(raw, dict, where)
        preset = {
            "name": need(raw.get("name"), str, f"{where}: name").strip()[:80],
            "system_prompt": need(raw.get("system_prompt") or "", str, f"{where}: system_prompt"),
        }
        for name, (low, high) in PRESET_NUMBERS.items():
            preset[name] = _clamp(number(raw.get(name), f"{where}: {name}"), low, high)
        for name, (low, high) in PRESET_INTEGERS.items():
            preset[name] = _clamp(optional(raw.get(name), int, f"{where}: {name}"), low, high)
        if preset["name"]:
            presets.append({k: v for k, v in preset.items() if v is not None})
    return {"folders": [n for n in folders if n], "presets": presets}


# --- Import: writing ------------------------------------------------------------------


def folders_by_name(owner, names: set[str]) -> dict[str, Folder]:
    """The owner's folders of these names, made where missing."""
    found = {f.name: f for f in Folder.objects.filter(owner=owner, name__in=names)}
    for name in sorted(names - set(found)):
        found[name] = Folder.objects.create(owner=owner, name=name)
    return found


def place(owner, pairs: list[tuple[dict, Conversation]]) -> None:
    """Set each new (unsaved) conversation's pin, archive date and folder from its fields."""
    folders = folders_by_name(owner, {f["folder"] for f, _ in pairs if f.get("folder")})
    for fields, conversation in pairs:
        conversation.pinned = fields.get("pinned", False)
        conversation.archived_at = fields.get("archived_at")
        conversation.folder = folders.get(fields.get("folder") or "")


def save_ratings(pairs: list[tuple[dict | None, Message]]) -> None:
    Rating.objects.bulk_create(
        [Rating(message=m, value=r["value"], reason=r["reason"]) for r, m in pairs if r is not None]
    )


def save_account_fields(owner, fields: dict) -> None:
    folders_by_name(owner, set(fields.get("folders", [])))
    have = set(Preset.objects.filter(owner=owner).values_list("name", flat=True))
    for preset in fields.get("presets", []):
        if preset["name"] not in have:
            Preset.objects.create(owner=owner, **preset)
            have.add(preset["name"])
