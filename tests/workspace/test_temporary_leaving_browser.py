"""Leaving a temporary chat in Chromium: the tab sends its close request once, whichever way
it leaves (another conversation, "New chat", a reload), and no 404 reaches the console; and
"New chat" then "Temporary chat" leaves no empty "New chat" row in the sidebar."""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import make_conversation, wait_until
from tests.chat.test_browser import in_thread, sign_up
from tests.support.browser import module_chromium
from tests.workspace.test_workspace_browser import new_page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CLOSE = re.compile(r"/chat/conversations/(\d+)/close/$")


@pytest.fixture(scope="module")
def browser(live_site):
    with module_chromium() as browser:
        yield browser


def deleted(pk: int) -> bool:
    def read():
        from conversations.models import Conversation

        return Conversation.all_objects.filter(pk=pk, deleted_at__isnull=False).exists()

    return in_thread(read)


def start_temporary_chat(page) -> int:
    """Turn on "Temporary chat", ask one question, wait for the answer: the chat's id."""
    from playwright.sync_api import expect

    toggle = page.get_by_role("button", name="Temporary chat")
    if not toggle.is_visible():  # the start options show on an empty chat
        page.get_by_role("button", name="New chat").click()
    expect(toggle).to_be_visible()
    if toggle.get_attribute("aria-pressed") != "true":
        toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    page.get_by_role("textbox", name="Message").fill("Hello?")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    expect(page.locator("article.msg-assistant").last).to_have_class(
        re.compile("status-(complete|error|stopped)"), timeout=60_000
    )
    return int(re.search(r"/c/(\d+)/", page.url).group(1))


def test_leaving_a_temporary_chat_closes_it_once_whichever_way(live_site, browser):
    url = live_site.url
    context, page, problems = new_page(browser)
    closes: list[int] = []
    context.on(
        "request",
        lambda request: (
            closes.append(int(CLOSE.search(request.url).group(1))) if CLOSE.search(request.url) else None
        ),
    )
    failed: list[str] = []
    context.on("response", lambda response: failed.append(response.url) if response.status >= 400 else None)
    sign_up(page, url, "leaver")
    saved_id, _ = make_conversation(
        "leaver",
        [
            {"role": "user", "content": "Kept?"},
            {"role": "assistant", "content": "Yes.", "status": "complete"},
        ],
        title="Kept one",
    )

    # To another conversation from the sidebar.
    page.reload()
    first = start_temporary_chat(page)
    page.get_by_role("link", name=re.compile("Kept one")).click()
    page.wait_for_url(f"{url}/c/{saved_id}/")
    wait_until(page, lambda: deleted(first))

    # To "New chat".
    second = start_temporary_chat(page)
    page.get_by_role("button", name="New chat").click()
    wait_until(page, lambda: deleted(second))

    # Away from the page: its pagehide beacon, which Playwright's request events do not show,
    # so only a failed second request (a 404) would.
    third = start_temporary_chat(page)
    page.goto(f"{url}/c/{saved_id}/")
    wait_until(page, lambda: deleted(third))
    page.wait_for_timeout(500)  # a second request, were one sent, would land by now

    assert sorted(closes) == [first, second]
    assert failed == []
    assert problems.errors == []
    context.close()


def test_new_chat_then_temporary_chat_leaves_no_empty_row(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    context, page, problems = new_page(browser)
    sign_up(page, url, "no-empty-row")
    make_conversation(
        "no-empty-row",
        [
            {"role": "user", "content": "Kept?"},
            {"role": "assistant", "content": "Yes.", "status": "complete"},
        ],
        title="Kept one",
    )
    page.reload()
    rows = page.locator("#conversation-list li.conversation-item")
    expect(rows).to_have_count(1)
    page.get_by_role("button", name="New chat").click()
    page.get_by_role("button", name="Temporary chat").click()
    expect(page.get_by_role("button", name="Temporary chat")).to_have_attribute("aria-pressed", "true")
    start_temporary_chat(page)
    expect(rows).to_have_count(1)
    expect(page.locator("#conversation-list").get_by_text("New chat")).to_have_count(0)

    def titles() -> list[str]:
        from conversations.models import Conversation

        return list(
            Conversation.objects.filter(owner__username="no-empty-row", temporary=False).values_list(
                "title", flat=True
            )
        )

    assert in_thread(titles) == ["Kept one"]
    assert problems.errors == []
    context.close()
