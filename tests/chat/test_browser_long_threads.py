"""Conversations past one websocket frame (Daphne's 1 MiB) in Debian's Chromium against the live
server: a 10,000-message conversation opens at once with its newest page, older pages come on
scroll; a single 5 MB answer opens and its whole text is fetched over HTTP; no frame the server
sends is over the limit; and a send that cannot fit closes the socket with an error the tab shows.
"""

from __future__ import annotations

import pytest

from tests.chat.browser_pages import assert_no_axe_violations, enforce_csp, wait_until
from tests.chat.test_browser import Problems, in_thread, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FRAME_LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def browser(live_site):
    with module_chromium() as browser:
        yield browser


def long_conversation(username: str, texts: list[str], **fields) -> int:
    """A conversation of ``username`` holding one path of ``texts`` (question, answer, ...),
    written in bulk with ids chosen here (a chain of parents in one insert)."""

    def make() -> int:
        from django.contrib.auth import get_user_model
        from django.db.models import Max

        from conversations.models import Conversation, Message

        owner = get_user_model().objects.get(username=username)
        conversation = Conversation.objects.create(owner=owner, title=fields.pop("title", "Long"), **fields)
        first = (Message.objects.aggregate(top=Max("id"))["top"] or 0) + 1_000_000
        rows = [
            Message(
                pk=first + i,
                conversation=conversation,
                parent_id=first + i - 1 if i else None,
                role="user" if i % 2 == 0 else "assistant",
                content=text,
                status="complete",
                finish_reason="" if i % 2 == 0 else "stop",
            )
            for i, text in enumerate(texts)
        ]
        Message.objects.bulk_create(rows, batch_size=2000)
        Conversation.objects.filter(pk=conversation.pk).update(current_leaf_id=first + len(texts) - 1)
        return conversation.pk

    return in_thread(make)


def watch_frames(page) -> list[int]:
    """The UTF-8 size of every websocket frame the page receives."""
    sizes: list[int] = []

    def on_socket(ws) -> None:
        ws.on(
            "framereceived",
            lambda payload: sizes.append(len(payload.encode() if isinstance(payload, str) else payload)),
        )

    page.on("websocket", on_socket)
    return sizes


def new_page(browser, live_site, username: str):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, reduced_motion="reduce")
    context.set_default_timeout(30_000)
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, live_site.url, username)
    return context, page, problems


def test_a_10000_message_conversation_opens_newest_first_and_pages_back(live_site, browser):
    from playwright.sync_api import expect

    context, page, problems = new_page(browser, live_site, "long-reader")
    pad = "lorem ipsum dolor sit amet " * 5  # ~135 bytes each: the whole thread is ~1.5 MB of JSON
    texts = [f"{'Question' if i % 2 == 0 else 'Answer'} number {i}. {pad}" for i in range(10_000)]
    conversation_id = long_conversation("long-reader", texts)
    frames = watch_frames(page)
    page.goto(f"{live_site.url}/c/{conversation_id}/")

    articles = page.locator("#thread article")
    expect(articles.last).to_contain_text("Answer number 9999.", timeout=20_000)
    shown = articles.count()
    assert 0 < shown <= 100
    assert_no_axe_violations(page, "a long conversation's newest page")
    # Older pages: scrolling to the top asks for the one before, and the button does too.
    first_before = articles.first.inner_text()
    page.locator("#thread-scroll").evaluate("el => el.scrollTo(0, 0)")
    wait_until(page, lambda: articles.count() > shown, seconds=20)
    assert articles.first.inner_text() != first_before
    assert f"number {10_000 - articles.count()}." in articles.first.inner_text()
    count = articles.count()
    page.get_by_role("button", name="Show earlier messages").click()
    wait_until(page, lambda: articles.count() > count, seconds=20)
    # The socket works: a question is answered below the newest message.
    page.locator("#prompt").fill("And one more?")
    page.locator("#prompt").press("Enter")
    expect(articles.filter(has_text="And one more?")).to_have_count(1, timeout=20_000)
    answers = page.locator("#thread article.msg-assistant")
    expect(answers.last).not_to_have_class("status-streaming", timeout=60_000)
    assert frames and max(frames) <= FRAME_LIMIT
    assert problems.errors == []
    context.close()


def test_a_single_5_mb_answer_opens_and_shows_whole(live_site, browser):
    from playwright.sync_api import expect

    context, page, problems = new_page(browser, live_site, "big-reader")
    answer = "".join(f"line {i}: {'x' * 40}\n" for i in range(100_000))  # ~5.3 MB
    assert len(answer.encode()) > 5_000_000
    conversation_id = long_conversation("big-reader", ["Write a lot.", answer], title="Big")
    frames = watch_frames(page)
    page.goto(f"{live_site.url}/c/{conversation_id}/")
    expect(page.locator("#thread article").first).to_contain_text("Write a lot.", timeout=20_000)
    content = page.locator("#thread article").last.locator(".msg-content")
    expect(content).to_contain_text("line 99999:", timeout=60_000)  # the end came over HTTP
    assert content.evaluate("el => el.textContent.length") >= len(answer) - 1
    assert frames and max(frames) <= FRAME_LIMIT
    assert problems.errors == []
    context.close()


def test_a_send_that_cannot_fit_closes_the_socket_with_an_error_shown(live_site, browser):
    """A frame over the limit (here a 2 MB system prompt in the conversation's settings) is
    never sent: the tab shows the error instead of waiting on a silent socket."""
    from playwright.sync_api import expect

    context, page, problems = new_page(browser, live_site, "too-big")
    conversation_id = long_conversation("too-big", ["Hi", "Hello."], system_prompt="p" * 2_000_000)
    frames = watch_frames(page)
    page.goto(f"{live_site.url}/c/{conversation_id}/")
    expect(page.locator("#toast[data-code='send_failed']")).to_be_visible(timeout=20_000)
    assert frames and max(frames) <= FRAME_LIMIT
    context.close()
