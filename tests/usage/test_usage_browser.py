"""The usage pages in Debian's Chromium after a real chat answer: the charts are drawn from
the aggregates that answer filled, each with its table, and axe finds nothing."""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import assert_no_axe_violations
from tests.chat.test_browser import browser, in_thread, sign_up  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def make_staff(username: str) -> None:
    def promote():
        from django.contrib.auth import get_user_model

        get_user_model().objects.filter(username=username).update(is_staff=True)

    in_thread(promote)


def test_the_usage_pages_draw_their_charts_after_an_answer(live_site, browser):  # noqa: F811
    from playwright.sync_api import expect

    url = live_site.url
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    sign_up(page, url, "counter")
    page.get_by_role("button", name="New chat").click()
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    prompt = page.get_by_role("textbox", name="Message")
    prompt.fill("Count to three")
    prompt.press("Enter")
    expect(page.locator("article.msg-assistant").last).to_have_class(
        re.compile("status-(complete|interrupted)"), timeout=60_000
    )

    page.goto(f"{url}/settings/usage/")
    expect(page.get_by_role("heading", name="Your usage")).to_be_visible()
    charts = page.locator("svg.usage-chart")
    expect(charts).to_have_count(2)
    expect(page.get_by_role("img", name="Your tokens per day, last 30 days")).to_be_visible()
    assert page.locator("svg.usage-chart").first.locator("rect").count() >= 1  # today's bars
    today = page.locator("table.visually-hidden").first.locator("tbody tr").last
    assert int(today.locator("td").nth(1).inner_text()) > 0  # completion tokens today
    assert_no_axe_violations(page, "your usage")

    make_staff("counter")
    page.goto(f"{url}/admin/usage/")
    expect(page.get_by_role("heading", name="Usage of the site")).to_be_visible()
    expect(page.locator("svg.usage-chart")).to_have_count(5)
    expect(page.get_by_role("img", name="Tokens per day by user")).to_be_visible()
    assert "counter" in page.locator("table.visually-hidden").first.inner_text()
    assert_no_axe_violations(page, "site usage")
