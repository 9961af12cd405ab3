"""Export and import: our JSON round trip, ChatGPT's format with branches, Markdown, and
hostile files that save nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conversations.chat.tree import Tree
from conversations.models import Conversation, Message
from conversations.transfer import InvalidFile, export_json, export_markdown, import_bytes, render_json

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.django_db


def normalised(record: dict) -> dict:
    """A conversation record with its ids replaced by positions, to compare two copies."""
    position = {m["id"]: i for i, m in enumerate(record["messages"])}

    def ref(value):
        return None if value is None else position[value]

    messages = [
        {**m, "id": position[m["id"]], "parent": ref(m["parent"]), "active_child": ref(m["active_child"])}
        for m in record["messages"]
    ]
    return {
        **record,
        "id": None,
        "current_leaf": ref(record["current_leaf"]),
        "active_root": ref(record["active_root"]),
        "messages": messages,
    }


@pytest.mark.smoke
def test_our_json_export_then_import_gives_an_equal_tree(branchy, bob):
    exported = export_json([branchy])
    record = exported["conversations"][0]
    assert {m["status"] for m in record["messages"]} == {"complete", "interrupted", "error"}
    assert len(record["messages"]) == 7 and record["top_k"] == 40

    result = import_bytes(bob, render_json(exported))
    assert result.format == "ours" and result.messages == 7
    copy = Conversation.objects.get(pk=result.conversation_ids[0], owner=bob)
    again = export_json([copy])["conversations"][0]
    assert normalised(again) == normalised(record)
    assert [m.content for m in Tree.load(copy).thread()] == [m.content for m in Tree.load(branchy).thread()]


@pytest.mark.smoke
def test_a_chatgpt_export_imports_with_its_branches(alice):
    result = import_bytes(alice, (FIXTURES / "chatgpt_branches.json").read_bytes())
    assert result.format == "chatgpt" and len(result.conversation_ids) == 2
    conversation = Conversation.objects.get(pk=result.conversation_ids[0])
    assert conversation.title == "Lisbon or Porto" and conversation.title_source == "imported"
    tree = Tree.load(conversation)
    roots = tree.roots()
    assert [r.content for r in roots] == ["Plan a trip to Lisbon", "Plan a trip to Porto"]
    lisbon = roots[0]
    assert [c.content for c in tree.children[lisbon.pk]] == ["Go in May.", "Try September."]
    go_in_may = tree.children[lisbon.pk][0]
    # The tool message is skipped; the answer after it hangs from the answer before it.
    assert [c.content for c in tree.children[go_in_may.pk]] == ["Flights are cheap in May."]
    assert [m.content for m in tree.thread()] == ["Plan a trip to Porto", "Porto is lovely."]
    porto = roots[1]
    assert conversation.active_root_id == porto.pk and porto.active_child_id == tree.children[porto.pk][0].pk
    assert go_in_may.model_name == "gpt-4o" and go_in_may.created_at.year == 2024


def test_markdown_holds_the_shown_thread(branchy):
    text = export_markdown([branchy])
    assert text.startswith("# Trip\n") and "## System\n\nBe brief." in text
    assert "Plan a trip to Lisbon" in text and "What about food?" in text
    assert "## Assistant (error)" in text
    assert "Porto" not in text and "September" not in text  # other branches are not shown


def test_a_deep_chain_imports_without_recursion(alice):
    depth = 3000
    messages = [
        {
            "id": i,
            "parent": i - 1 if i else None,
            "role": "user" if i % 2 == 0 else "assistant",
            "content": str(i),
        }
        for i in range(depth)
    ]
    data = {"format": "chatsite.conversations", "version": 1, "conversations": [{"messages": messages}]}
    result = import_bytes(alice, json.dumps(data).encode())
    thread = Tree.load(Conversation.objects.get(pk=result.conversation_ids[0])).thread()
    assert len(thread) == depth and thread[-1].content == str(depth - 1)


def ours(*conversations) -> dict:
    return {"format": "chatsite.conversations", "version": 1, "conversations": list(conversations)}


GOOD = {"title": "fine", "messages": [{"id": 1, "parent": None, "role": "user", "content": "hi"}]}


def chatgpt_with(mapping: dict) -> list:
    return [{"title": "x", "mapping": mapping}]


def node(parent, role="user", text="hi"):
    message = {"author": {"role": role}, "content": {"content_type": "text", "parts": [text]}}
    return {"message": message, "parent": parent}


HOSTILE = {
    "wrong shape": ({"hello": "world"}, "neither a chatsite export nor ChatGPT"),
    "a list of numbers": ([1, 2, 3], "neither a chatsite export nor ChatGPT"),
    "messages not a list": (ours({"messages": {"a": 1}}), "messages: expected a list"),
    "an unknown role": (ours({"messages": [{"id": 1, "role": "wizard", "content": ""}]}), "unknown role"),
    "a number that is true": (
        ours({"messages": [{"id": 1, "role": "user", "content": "", "prompt_tokens": True}]}),
        "prompt_tokens: expected an integer",
    ),
    "a duplicate id": (
        ours({"messages": [{"id": 1, "role": "user"}, {"id": 1, "role": "assistant", "parent": 1}]}),
        "used twice",
    ),
    "a cycle in ours": (
        ours(
            {
                "messages": [
                    {"id": 1, "parent": None, "role": "user"},
                    {"id": 2, "parent": 3, "role": "user"},
                    {"id": 3, "parent": 2, "role": "assistant"},
                ]
            }
        ),
        "cycle",
    ),
    "a cycle in ChatGPT's": (
        chatgpt_with({"r": node(None), "a": node("b"), "b": node("a", "assistant")}),
        "cycle",
    ),
    "a self-parent": (chatgpt_with({"a": node("a")}), "cycle"),
    "a missing parent": (chatgpt_with({"r": node(None), "a": node("nowhere")}), "missing parent 'nowhere'"),
    "a missing parent in ours": (
        ours({"messages": [{"id": 5, "parent": 4, "role": "user"}]}),
        "missing parent 4",
    ),
    "a good conversation then a broken one": (
        ours(GOOD, {"messages": [{"id": 1, "parent": 9, "role": "user"}]}),
        "conversation 2",
    ),
    "an unknown version": ({"format": "chatsite.conversations", "version": 99}, "version 99"),
    "no conversations": ([], "no conversations"),
}


@pytest.mark.smoke
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_file_saves_nothing(alice, case):
    data, expected = HOSTILE[case]
    with pytest.raises(InvalidFile, match=expected):
        import_bytes(alice, json.dumps(data).encode())
    assert not Conversation.all_objects.exists() and not Message.objects.exists()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
        (b"\xff\xfe not text", "not UTF-8"),
        (b'{"format": "chatsite.conversations", ', "not valid JSON"),
    ],
    ids=["deep nesting", "not utf-8", "truncated"],
)
def test_unreadable_files_save_nothing(alice, raw, expected):
    with pytest.raises(InvalidFile, match=expected):
        import_bytes(alice, raw)
    assert not Conversation.all_objects.exists()


def test_a_file_over_the_cap_is_refused_before_parsing(alice, settings):
    settings.IMPORT_MAX_BYTES = 1000
    with pytest.raises(InvalidFile, match="the limit is 1,000"):
        import_bytes(alice, json.dumps(ours(GOOD)).encode() + b" " * 1000)
    assert not Conversation.all_objects.exists()


def test_the_message_cap_applies_to_the_whole_file(alice, settings):
    settings.IMPORT_MAX_MESSAGES = 1
    two = {"messages": [{"id": 1, "role": "user"}, {"id": 2, "parent": 1, "role": "assistant"}]}
    with pytest.raises(InvalidFile, match="limit is 1"):
        import_bytes(alice, json.dumps(ours(two)).encode())
    assert not Conversation.all_objects.exists()


@pytest.mark.parametrize("fmt", ["ours", "chatgpt"])
def test_a_file_over_the_conversation_cap_is_refused_before_its_conversations_are_read(
    alice, settings, monkeypatch, fmt
):
    from conversations.transfer import chatgpt, importing

    def unread(*args):
        raise AssertionError("a conversation was read")

    monkeypatch.setattr(importing, "_our_conversation", unread)
    monkeypatch.setattr(chatgpt, "_conversation", unread)
    settings.IMPORT_MAX_CONVERSATIONS = 2
    data = ours(GOOD, GOOD, GOOD) if fmt == "ours" else chatgpt_with({"r": node(None)}) * 3
    with pytest.raises(InvalidFile, match="the file holds 3 conversations; the limit is 2"):
        import_bytes(alice, json.dumps(data).encode())
    assert not Conversation.all_objects.exists()


def test_three_hundred_thousand_empty_conversations_are_refused_at_once(alice):
    # 10.8 MB, under the byte limit: counted before anything is written.
    raw = json.dumps(ours(*[{"title": "empty", "messages": []}] * 300_000)).encode()
    with pytest.raises(InvalidFile, match="300,000 conversations; the limit is 10,000"):
        import_bytes(alice, raw)
    assert not Conversation.all_objects.exists()
