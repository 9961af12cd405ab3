"""Two models served by one process, in Chromium: the user picks each model in turn, sends one
question to both side by side, keeps one of the two answers and continues from it; each answer
is stored with the model that wrote it."""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import enforce_csp, wait_until
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

    # One question, two models side by side: two sibling answers, one per model.
    page.get_by_label("Side by side with").select_option("tiny2")
    ask(page, "Both of you?")
    answered(page, username, 4)
    pair = answers(username)[2:]
    assert {row["parent__content"] for row in pair} == {"Both of you?"}
    assert len({row["parent_id"] for row in pair}) == 1
    assert sorted(row["model_name"] for row in pair) == ["smol", "tiny2"]
    last = page.locator("article.msg-assistant").last
    expect(last.get_by_role("group", name=re.compile(r"Branch \d of 2"))).to_be_visible()

    # Keep tiny2's answer: show it, then go on from it.
    kept = next(row for row in pair if row["model_name"] == "tiny2")
    for _ in range(2):
        if "tiny2" in last.inner_text():
            break
        button = last.get_by_role("button", name=re.compile("(Next|Previous) branch")).locator("visible=true")
        enabled = [b for b in button.all() if b.is_enabled()]
        enabled[0].click()
        expect(last).to_contain_text("tiny2")
    expect(last).to_contain_text("tiny2")
    page.get_by_label("Side by side with").select_option("")
    ask(page, "Go on from there.")
    answered(page, username, 5)

    def question_parent() -> int:
        from conversations.models import Message

        return Message.objects.get(
            conversation__owner__username=username, content="Go on from there."
        ).parent_id

    assert in_thread(question_parent) == kept["pk"]
    assert answers(username)[-1]["model_name"] == "smol"  # the conversation's own model again
    assert problems.errors == []
    context.close()
