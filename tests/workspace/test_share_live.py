"""A share continued on the live site (Daphne, tiny model) in Chromium: the owner's chat holds
what its page never shows (a question whose stored ids carry a retrieved passage, a tool step
quoting another conversation, tools on with approval off); the reader's copy holds the shown
text only, with the reader's own tool defaults."""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import enforce_csp, make_conversation
from tests.chat.test_browser import Problems, in_thread, sign_up
from tests.chat.test_browser_long_threads import browser  # noqa: F401  (the module's Chromium)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def copies_of(username: str) -> list[dict]:
    def read():
        from conversations.models import Conversation, Message

        conversation = Conversation.objects.get(owner__username=username)
        rows = Message.objects.filter(conversation=conversation).order_by("id")
        return [
            {
                "role": m.role,
                "content": m.content,
                "token_ids": m.token_ids,
                "tool_calls": m.tool_calls,
                "tools": (conversation.tools_enabled, conversation.tools_approval),
            }
            for m in rows
        ]

    return in_thread(read)


def test_continue_in_my_account_copies_only_the_shown_text(live_site, browser):  # noqa: F811
    from playwright.sync_api import expect

    url = live_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(30_000)
    enforce_csp(context)
    owner = context.new_page()
    problems = Problems(owner)
    sign_up(owner, url, "share-owner")
    calls = [{"id": "c1", "name": "search_conversations", "arguments": '{"query": "code"}'}]
    conversation_id, _ = make_conversation(
        "share-owner",
        [
            {"role": "user", "content": "What did I note?", "token_ids": list(range(900, 1851))},
            {"role": "assistant", "content": "", "tool_calls": calls, "finish_reason": "tool_calls"},
            {
                "role": "tool",
                "content": "Vault: the secret code is 4417",
                "tool_name": "search_conversations",
            },
            {"role": "assistant", "content": "You noted a plan.", "token_ids": [5, 6, 7]},
        ],
        title="Notes",
        tools_enabled=True,
        tools_approval=False,
    )
    owner.goto(f"{url}/c/{conversation_id}/")
    expect(owner.locator("article.msg-assistant").last).to_contain_text("You noted a plan.")
    owner.get_by_role("button", name="More actions").click()
    owner.get_by_role("button", name="Share").click()
    expect(owner.locator("#share-url")).to_have_value(re.compile(r"/s/[\w-]{20,}/$"))
    link = owner.locator("#share-url").input_value()

    reader_context = browser.new_context()
    reader = reader_context.new_page()
    sign_up(reader, url, "share-reader")
    reader.goto(link)
    assert "4417" not in reader.content()
    reader.get_by_role("button", name="Continue in my account").click()
    reader.wait_for_url(re.compile(r"/c/\d+/$"))
    expect(reader.locator("article.msg-assistant")).to_contain_text("You noted a plan.")
    copied = copies_of("share-reader")
    assert [(m["role"], m["content"]) for m in copied] == [
        ("user", "What did I note?"),
        ("assistant", "You noted a plan."),
    ]
    assert all(m["token_ids"] is None and m["tool_calls"] is None for m in copied)
    assert copied[0]["tools"] == (False, False)
    assert problems.errors == []
    reader_context.close()
    context.close()
