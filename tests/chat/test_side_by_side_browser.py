"""Two models served by one process, in Chromium: the user picks each model in turn, sends one
question to both side by side, sees the two answers stream into columns headed by their models,
keeps the second and continues from it; each answer is stored with the model that wrote it."""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import RoutedSocket, assert_no_axe_violations, enforce_csp, wait_until
from tests.chat.test_browser import Problems, in_thread, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser(multi_model_site):
    with module_chromium() as browser:
        yield browser


def answers(username: str) -> list[dict]:
    def read():
        from conversations.models import Message

        return list(
            Message.objects.filter(conversation__owner__username=username, role="assistant")
            .order_by("pk")
            .values("pk", "parent_id", "parent__content", "model_name", "status")
        )

    return in_thread(read)


def ask(page, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.keyboard.press("Enter")


def settled(rows: list[dict]) -> bool:
    return all(row["status"] in ("complete", "error", "stopped") for row in rows)


def answered(page, username: str, count: int) -> None:
    """``count`` answers stored and done, and the page no longer busy with them."""
    from playwright.sync_api import expect

    wait_until(page, lambda: len(answers(username)) == count and settled(answers(username)), seconds=60)
    expect(page.locator("article.msg-assistant.status-streaming")).to_have_count(0)


def question_parent(username: str, content: str) -> int:
    from conversations.models import Message

    return in_thread(
        lambda: Message.objects.get(conversation__owner__username=username, content=content).parent_id
    )


def current_leaf(username: str) -> int:
    from conversations.models import Conversation

    return in_thread(lambda: Conversation.objects.get(owner__username=username).current_leaf_id)


def streamed_together(received: list[dict], ids: set[int]) -> bool:
    """Each of ``ids`` had text on the socket before the first of them finished."""
    with_text: set[int] = set()
    for event in list(received):
        if event.get("type") == "delta" and event.get("text"):
            with_text.add(event["message_id"])
        if event.get("type") == "finished" and event["message"]["id"] in ids:
            break
    return ids <= with_text


def check_phone_width(page) -> None:
    """At 390 px the columns scroll sideways, snapping, inside the thread: the page does not."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 390, "height": 844})
    columns = page.locator(".sbs-columns")
    expect(columns).to_have_css("scroll-snap-type", "x mandatory")
    wide = page.evaluate(  # named in the failure: what reaches past the screen's right edge
        """() => [...document.querySelectorAll("body *")]
        .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 1)
        .slice(0, 8).map((el) => `${el.tagName}.${el.className} ${el.getBoundingClientRect().right}`)"""
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), wide
    assert columns.evaluate("el => el.scrollWidth > el.clientWidth")  # the second column is beside
    assert_no_axe_violations(page, "side-by-side columns at phone width")
    page.set_viewport_size({"width": 1280, "height": 800})


def ask_both_then_keep_the_second(page, username: str) -> dict:
    """One question to smol and tiny2: two columns stream at once; the second is kept by
    keyboard and the columns become the usual single answer. Returns the kept answer's row."""
    from playwright.sync_api import expect

    socket = RoutedSocket(page)
    page.reload()  # the socket now passes through the recorder
    page.get_by_label("Side by side with").select_option("tiny2")
    ask(page, "Both of you?")
    group = page.get_by_role("group", name="2 answers side by side")
    expect(group).to_be_visible()
    expect(group.get_by_role("heading")).to_have_text([re.compile("^smol"), re.compile("^tiny2")])
    answered(page, username, 4)
    pair = answers(username)[2:]
    assert {row["parent__content"] for row in pair} == {"Both of you?"}
    assert len({row["parent_id"] for row in pair}) == 1
    assert [row["model_name"] for row in pair] == ["smol", "tiny2"]
    # Both answers streamed into the page at once, each into its own column.
    assert streamed_together(socket.received, {row["pk"] for row in pair})
    columns = group.locator(".sbs-col")
    expect(columns).to_have_count(2)
    for column, row in zip(columns.all(), pair, strict=True):
        expect(column.locator(f'article[data-id="{row["pk"]}"] .msg-content')).not_to_be_empty()
    assert_no_axe_violations(page, "side-by-side columns")
    check_phone_width(page)

    kept = pair[1]
    keep = columns.nth(1).get_by_role("button", name="Keep this answer")
    keep.focus()
    page.keyboard.press("Enter")
    expect(page.locator(".sbs")).to_have_count(0)
    last = page.locator("article.msg-assistant").last
    expect(last).to_have_attribute("data-id", str(kept["pk"]))
    expect(last).to_contain_text("tiny2")
    expect(last.get_by_role("group", name="Branch 2 of 2")).to_be_visible()
    wait_until(page, lambda: current_leaf(username) == kept["pk"], seconds=30)
    # A reload shows the choice kept.
    page.reload()
    expect(page.locator("article.msg-assistant").last).to_have_attribute("data-id", str(kept["pk"]))
    expect(page.locator(".sbs")).to_have_count(0)
    return kept


def test_pick_each_model_then_ask_two_side_by_side_keep_one_and_go_on(multi_model_site, browser):
    from playwright.sync_api import expect

    url = multi_model_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800}, reduced_motion="reduce")
    context.set_default_timeout(60_000)
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    username = "two-models"
    sign_up(page, url, username)
    picker = page.get_by_label("Model", exact=True)
    expect(picker).to_be_visible()

    # Each model in turn, in one conversation.
    picker.select_option("tiny2")
    ask(page, "First, tiny2?")
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    answered(page, username, 1)
    picker.select_option("smol")
    ask(page, "Then smol?")
    answered(page, username, 2)
    assert [row["model_name"] for row in answers(username)] == ["tiny2", "smol"]
    expect(page.locator("article.msg-assistant").last).to_contain_text("smol")

    # One question, two models side by side, in columns; keep tiny2's answer and go on from it.
    kept = ask_both_then_keep_the_second(page, username)
    page.get_by_label("Side by side with").select_option("")
    ask(page, "Go on from there.")
    answered(page, username, 5)
    assert question_parent(username, "Go on from there.") == kept["pk"]
    assert answers(username)[-1]["model_name"] == "smol"  # the conversation's own model again
    assert problems.errors == []
    context.close()
