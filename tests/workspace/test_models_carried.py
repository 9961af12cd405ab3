"""Export, import, fork and shares carry the model of each answer, and the conversation's own
model choice: two answers to one question by two models, side by side, keep their names."""

from __future__ import annotations

import json

import pytest

from conversations.chat import tree as tree_ops
from conversations.chat.fork import fork_at
from conversations.chat.tree import Tree
from conversations.models import Conversation, Message
from conversations.transfer import import_bytes
from conversations.transfer.jobs import render_export
from conversations.workspace.sharing import fork_share, take_snapshot
from tests.workspace.conftest import finish, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_models(alice) -> tuple[Conversation, Message, Message]:
    """Q → an answer by "model-a" and, beside it, one by "model-b" (shown); the conversation set
    to "model-b"."""
    conversation = Conversation.objects.create(owner=alice, title="Compare", model="model-b")
    _, first = tree_ops.send_message(conversation, "Name a prime.")
    first = finish(first, "Two.", model_name="model-a")
    _, second = tree_ops.regenerate(conversation, first.pk)
    second = finish(second, "Seven.", model_name="model-b")
    conversation.refresh_from_db()
    return conversation, first, second


def answers_by_model(conversation: Conversation) -> dict[str, str]:
    return dict(
        Message.objects.filter(conversation=conversation, role=Message.Role.ASSISTANT).values_list(
            "content", "model_name"
        )
    )


def test_export_then_import_keeps_each_answers_model_and_the_conversations(two_models, alice, bob):
    conversation, _first, _second = two_models
    data = json.loads(render_export(alice, "json"))
    record = data["conversations"][0]
    assert record["model"] == "model-b"
    assert {m["content"]: m["model"] for m in record["messages"] if m["role"] == "assistant"} == {
        "Two.": "model-a",
        "Seven.": "model-b",
    }
    result = import_bytes(bob, json.dumps(data).encode())
    imported = Conversation.objects.get(pk=result.conversation_ids[0], owner=bob)
    assert imported.model == "model-b"
    assert answers_by_model(imported) == {"Two.": "model-a", "Seven.": "model-b"}
    # The Markdown export names the model that wrote the shown answer.
    text = render_export(alice, "markdown").decode()
    assert "## Assistant · model-b\n\nSeven." in text


def test_a_fork_keeps_each_answers_model_and_the_conversations(two_models, alice):
    conversation, first, _second = two_models
    fork = fork_at(alice, first.pk)
    assert fork.model == "model-b"
    assert [(m.content, m.model_name) for m in Tree.load(fork).thread()] == [
        ("Name a prime.", ""),
        ("Two.", "model-a"),
    ]


def test_a_share_shows_and_its_continued_copy_keeps_the_answers_model(two_models, bob):
    conversation, _first, _second = two_models
    share = take_snapshot(conversation)
    assert share.settings["model"] == "model-b"
    page = signed_in(bob).get(f"/s/{share.token}/").content.decode()
    assert '<p class="shared-model">model-b</p>' in page
    copy = fork_share(share, bob)
    assert copy.model == "model-b"
    assert [(m.content, m.model_name) for m in Tree.load(copy).thread()][-1] == ("Seven.", "model-b")
