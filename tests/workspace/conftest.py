"""Fixtures for the workspace tests: quick users and a conversation with a regenerated answer."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message


@pytest.fixture(autouse=True)
def _no_model_titles(settings):
    settings.TITLES_FROM_MODEL = False


@pytest.fixture(autouse=True)
def _fresh_counts():
    """Rate-limit windows live in the cache: each test starts with none counted."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def quick_user(db):
    def make(username: str):
        return get_user_model().objects.create(username=username)

    return make


@pytest.fixture
def alice(quick_user):
    return quick_user("alice")


@pytest.fixture
def bob(quick_user):
    return quick_user("bob")


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def post_json(client: Client, url: str, data=None):
    return client.post(url, json.dumps(data if data is not None else {}), content_type="application/json")


def finish(message: Message, content: str, **fields) -> Message:
    Message.objects.filter(pk=message.pk).update(
        content=content, status=Message.Status.COMPLETE, finish_reason="stop", **fields
    )
    message.refresh_from_db()
    return message


@pytest.fixture
def regenerated(alice) -> tuple[Conversation, Message, Message, Message]:
    """Q → A1, and A2 regenerated beside it (showing A2): the conversation, Q, A1, A2."""
    conversation = Conversation.objects.create(owner=alice, title="Sums", system_prompt="Be exact.")
    _, first = tree_ops.send_message(conversation, "What is 2+2?")
    first = finish(first, "Five.", token_ids=[1, 2, 3], token_fingerprint="fp", model_name="tiny")
    _, second = tree_ops.regenerate(conversation, first.pk)
    second = finish(second, "Four: $2+2=4$.", token_ids=[4, 5], token_fingerprint="fp", model_name="tiny")
    question = Message.objects.get(pk=first.parent_id)
    Message.objects.filter(pk=question.pk).update(token_ids=[7, 8, 9], token_fingerprint="fp")
    conversation.refresh_from_db()
    return conversation, question, first, second
