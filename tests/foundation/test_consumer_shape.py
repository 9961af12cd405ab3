"""The websocket consumer parses, dispatches and pushes: where an answer runs is the chat
service's business (``conversations.chat.service``), so the consumer imports nothing from
``conversations.cluster`` and stays small."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.foundation.test_import_direction import imported_names

CONSUMER = Path(__file__).resolve().parents[2] / "conversations" / "chat" / "consumers.py"
MAX_CONSUMER_LINES = 250


def test_the_consumer_knows_no_cluster() -> None:
    assert sorted(n for n in imported_names(CONSUMER) if n.startswith("conversations.cluster")) == []


def test_the_chat_consumer_is_small() -> None:
    tree = ast.parse(CONSUMER.read_text(encoding="utf-8"))
    (consumer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChatConsumer"]
    assert consumer.end_lineno - consumer.lineno + 1 < MAX_CONSUMER_LINES
