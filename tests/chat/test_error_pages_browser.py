"""The error pages in Chromium: each in the site's look (its stylesheet applied, the card and
a way back), with axe at 0 violations in light and dark mode, under the site's CSP."""

from __future__ import annotations

import pytest

from tests.chat.browser_pages import (
    assert_no_axe_violations,
    enforce_csp,
    make_conversation,
    share_conversation,
)
from tests.chat.test_browser import Problems, in_thread, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser(live_site):
    with module_chromium() as browser:
        yield browser


def rendered_pages() -> dict[int, str]:
    """The 403, 429 and 500 pages as the views render them: no page of the site answers
    these on demand, so the browser is handed their bodies at the site's own address."""
    from django.test import RequestFactory

    from conversations import error_pages

    request = RequestFactory().get("/")
    return {
        403: error_pages.permission_denied(request).content.decode(),
        429: error_pages.too_many(None, "Too many requests for the test.").content.decode(),
        500: error_pages.server_error(request).content.decode(),
    }


def revoke(share_token: str) -> None:
    def run():
        from django.utils import timezone

        from conversations.models import Share

        Share.objects.filter(token=share_token).update(revoked_at=timezone.now())

    in_thread(run)


def serving(status: int, body: str):
    def fulfill(route, request) -> None:
        route.fulfill(status=status, body=body, content_type="text/html; charset=utf-8")

    return fulfill


def assert_site_look(page, heading: str) -> None:
    from playwright.sync_api import expect

    expect(page.get_by_role("heading", level=1, name=heading)).to_be_visible()
    card = page.locator("main.auth-card")
    # The site's stylesheet is applied: the card has its border radius and the page its grid.
    assert card.evaluate("el => getComputedStyle(el).borderTopLeftRadius") == "14px"
    assert page.locator("body").evaluate("el => getComputedStyle(el).display") == "grid"
    back = page.get_by_role("link", name="Back to your chats")
    expect(back).to_be_visible()
    assert back.get_attribute("href") == "/"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_error_page_has_the_site_look_a_way_back_and_no_axe_violations(live_site, browser, scheme):
    url = live_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
    context.set_default_timeout(30_000)
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    username = f"errors-{scheme}"
    sign_up(page, url, username)

    response = page.goto(f"{url}/no-such-page/")
    assert response.status == 404
    assert_site_look(page, "Page not found")
    assert_no_axe_violations(page, f"404 ({scheme})")

    conversation_id, _ = make_conversation(
        username,
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "status": "complete"}],
    )
    token = share_conversation(conversation_id)
    assert page.goto(f"{url}/s/{token}/").status == 200
    revoke(token)
    response = page.goto(f"{url}/s/{token}/")
    assert response.status == 410
    assert_site_look(page, "This share link was revoked")
    assert_no_axe_violations(page, f"410 ({scheme})")

    headings = {403: "Not allowed", 429: "Too many requests", 500: "Something went wrong"}
    for status, body in in_thread(rendered_pages).items():
        page.route(f"{url}/error-page-{status}/", serving(status, body))
        assert page.goto(f"{url}/error-page-{status}/").status == status
        assert_site_look(page, headings[status])
        assert_no_axe_violations(page, f"{status} ({scheme})")

    page.get_by_role("link", name="Back to your chats").click()
    page.wait_for_url(f"{url}/")
    # Only the error statuses themselves reach the console, no script or CSP error.
    assert [e for e in problems.errors if "status of" not in e] == []
    context.close()
