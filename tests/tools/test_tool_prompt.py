"""How a conversation with tool calls is rendered for the prompt: one message per history item
(the prompt's cuts count them), stored ids kept only where the format left a message as it was."""

from __future__ import annotations

import pytest

from conversations.chat.prompts import ToolPrompt, chat_messages
from inference.tools.formats import format_named

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "", "parameters": {}}}]
CALLS = [
    {"id": "call_1", "name": "calculator", "arguments": '{"expression": "1+1"}'},
    {"id": "call_2", "name": "calculator", "arguments": '{"expression": "2+2"}'},
]


def history() -> list[dict]:
    return [
        {"role": "user", "content": "sums?", "token_ids": [1, 2]},
        {"role": "assistant", "content": "", "token_ids": [7, 8, 9], "tool_calls": CALLS},
        {"role": "tool", "content": "2", "tool_call_id": "call_1", "tool_name": "calculator"},
        {"role": "tool", "content": "4", "tool_call_id": "call_2", "tool_name": "calculator"},
    ]


@pytest.mark.smoke
@pytest.mark.parametrize("name", ["hermes", "generic", "llama3"])
def test_one_rendered_message_per_item_with_the_tools_described(name):
    messages = chat_messages("Be brief.", history(), ToolPrompt(format_named(name), TOOLS))
    assert len(messages) == 5  # the system message, then one per item, even where the format merges
    assert all(set(m) <= {"role", "content", "token_ids"} for m in messages)
    assert "calculator" in messages[0]["content"] or "calculator" in messages[1]["content"]
    assert messages[2]["token_ids"] == [7, 8, 9]  # the answer's ids hold its calls as generated
    assert "2+2" in messages[2]["content"]
    assert "4" in messages[4]["content"] and messages[4]["role"] != "assistant"
    changed_user = messages[1]["content"] != "sums?"
    assert ("token_ids" in messages[1]) is not changed_user  # llama3 puts the tools in it


def test_without_offered_tools_the_history_still_renders_its_calls():
    messages = chat_messages("", history(), ToolPrompt(format_named("generic"), []))
    assert len(messages) == 4 and messages[0] == {"role": "user", "content": "sums?"}  # first: no ids
    assert "<tool_call>" in messages[1]["content"] and "<tool_response>" in messages[2]["content"]
