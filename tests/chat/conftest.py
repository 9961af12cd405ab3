"""Fixtures for the chat tests: the process's engine on the tiny random model."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from conversations.models import Conversation
from tests.conftest import websocket


@pytest.fixture(autouse=True)
def _no_model_titles(settings):
    """Model-written titles (a background task after each first answer) are tested in
    tests/jobs; here they would only add events and engine work to every chat test."""
    settings.TITLES_FROM_MODEL = False


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """Point conversations.ops.engine_handle at the tiny model for the whole session."""
    from conversations.ops.engine_handle import reset_engine_for_tests

    original = settings.ENGINE
    settings.ENGINE = {**original, "model": str(tiny_model_dir), "kv_cache_gb": 0.25}
    reset_engine_for_tests()
    yield
    reset_engine_for_tests()
    settings.ENGINE = original


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    """One for the session (a second or so to load each time): tests read it, and the one
    that changes a template changes a deep copy."""
    from transformers import AutoTokenizer

    from inference.tokenizer import Tokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture
def make_conversation():
    def make(owner, **fields) -> Conversation:
        return Conversation.objects.create(owner=owner, **fields)

    return make


class Socket:
    """A WebsocketCommunicator with helpers to read the chat protocol."""

    def __init__(self, communicator):
        self.communicator = communicator

    @classmethod
    async def open(cls, user, path: str = "/ws/chat/") -> Socket:
        communicator = await sync_to_async(websocket)(path, user)
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        return cls(communicator)

    async def send(self, **message) -> None:
        await self.communicator.send_json_to(message)

    async def receive(self, timeout: float = 30) -> dict:
        return await self.communicator.receive_json_from(timeout=timeout)

    async def until(self, kind: str, timeout: float = 60, **match) -> tuple[dict, list[dict]]:
        """Events up to the first of type ``kind`` whose fields equal ``match``."""
        seen = []
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            assert remaining > 0, f"no {kind} event; saw {[e.get('type') for e in seen]}"
            event = await self.receive(timeout=remaining)
            seen.append(event)
            if event.get("type") == kind and all(event.get(k) == v for k, v in match.items()):
                return event, seen

    async def finished(self, message_id: int | None = None, timeout: float = 60) -> tuple[dict, list[dict]]:
        everything: list[dict] = []
        while True:
            event, seen = await self.until("finished", timeout=timeout)
            everything += seen
            if message_id is None or event["message"]["id"] == message_id:
                return event["message"], everything

    async def open_and_ask(self, conversation_id: int, content: str) -> dict:
        """Open the conversation, send ``content`` and wait for the answer's ``finished``."""
        await self.send(type="open", conversation_id=conversation_id)
        await self.until("thread")
        await self.send(type="send", conversation_id=conversation_id, content=content)
        thread, _ = await self.until("thread")
        answer, _ = await self.finished(thread["messages"][-1]["id"])
        return answer

    async def close(self) -> None:
        await self.communicator.disconnect()
