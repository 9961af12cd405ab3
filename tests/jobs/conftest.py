"""Fixtures for the background-job tests."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from chatsite.celery import app as celery_app
from conversations.chat import tree as tree_ops
from conversations.models import Conversation, Message


@pytest.fixture
def eager_tasks():
    """Run tasks in the calling process even when REDIS_URL configured a real broker (the
    tests that need a worker start one themselves)."""
    saved = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = saved


@pytest.fixture
def quick_user(db):
    """A user with no password (tests sign in with force_login): no password hashing to pay."""

    def make(username: str):
        return get_user_model().objects.create(username=username)

    return make


@pytest.fixture
def alice(quick_user):
    return quick_user("alice")


@pytest.fixture
def bob(quick_user):
    return quick_user("bob")


def answer(message: Message, content: str, **fields) -> Message:
    """Finish a streaming answer as the generation manager would."""
    fields.setdefault("status", Message.Status.COMPLETE)
    fields.setdefault("finish_reason", "stop")
    Message.objects.filter(pk=message.pk).update(content=content, **fields)
    message.refresh_from_db()
    return message


@pytest.fixture
def branchy(alice) -> Conversation:
    """Q1 → A1 → Q2 → A2, a regenerated A1b under Q1, an edited root Q1b → A1c, showing A2."""
    conversation = Conversation.objects.create(
        owner=alice,
        title="Trip",
        system_prompt="Be brief.",
        temperature=0.3,
        top_p=0.9,
        top_k=40,
        max_tokens=200,
    )
    _, a1 = tree_ops.send_message(conversation, "Plan a trip to Lisbon")
    answer(
        a1,
        "Go in May.",
        prompt_tokens=12,
        completion_tokens=4,
        time_to_first_token_ms=35.5,
        tokens_per_s=40.0,
    )
    _, a1b = tree_ops.regenerate(conversation, a1.pk)
    answer(a1b, "Try September.", status=Message.Status.INTERRUPTED, finish_reason="abort")
    _, q1b_answer = tree_ops.edit_message(conversation, a1.parent_id, "Plan a trip to Porto")
    answer(q1b_answer, "Porto is lovely.", model_name="tiny")
    tree_ops.switch_branch(conversation, a1.pk)
    _, a2 = tree_ops.send_message(conversation, "What about food?")
    answer(a2, "Pastéis de nata.", status=Message.Status.ERROR, error="boom")
    conversation.refresh_from_db()
    return conversation


# The chat tests' engine on the tiny random model (imported, so pytest registers it here too).
from tests.chat.conftest import tiny_engine  # noqa: E402, F401
