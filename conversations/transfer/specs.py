"""What an importer makes of a file before anything is saved."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class NodeSpec:
    key: Any
    parent: Any
    role: str
    content: str
    fields: dict = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    active_child: Any = None
    rating: dict | None = None  # {"value": 1 | -1, "reason"} (conversations.transfer.workspace_fields)


@dataclass
class ConversationSpec:
    title: str
    title_source: str
    settings: dict
    nodes: list[NodeSpec]  # parents first
    current_leaf: Any = None
    active_root: Any = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # pinned, archived_at, folder (a name): conversations.transfer.workspace_fields
    workspace: dict = field(default_factory=dict)
