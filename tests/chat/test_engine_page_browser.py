"""The admin's engine status page in Chromium: the static module polls the live figures
and draws the plots and the tiers table in place, without reloading the page and with
no script error (the CSP allows no inline script)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.chat.test_browser import CHROMIUM_ARGS, Problems, browser, site  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ops():
    """A staff user, created before Playwright's event loop starts in this thread."""
    return get_user_model().objects.create_superuser("ops", "ops@example.com", "correct-horse-battery-9")


def test_the_engine_page_plots_live_figures_without_reloading(site, ops, browser):  # noqa: F811
    page = browser.new_page()
    problems = Problems(page)
    failed: list[str] = []
    page.on("response", lambda r: r.status >= 400 and failed.append(r.url))
    page.goto(f"{site.url}/admin/login/?next=/admin/conversations/enginestatus/")
    page.locator("#id_username").fill("ops")
    page.locator("#id_password").fill("correct-horse-battery-9")
    page.locator("input[type=submit]").click()
    page.wait_for_url("**/admin/conversations/enginestatus/")
    page.evaluate("window.__loadedOnce = true")
    page.wait_for_selector('svg[data-plot="tokens_per_s"] polyline', state="attached", timeout=20_000)
    page.wait_for_selector("[data-tiers] tr", timeout=20_000)  # the pool's row, from the live JSON
    with page.expect_response(lambda r: r.url.endswith("/enginestatus/live/"), timeout=10_000):
        pass  # a later poll: the page keeps updating
    assert page.evaluate("window.__loadedOnce") is True  # the same document: no reload
    assert page.locator("[data-tiers] tr td").first.text_content() == "pool"
    assert page.locator('[data-latest="tokens_per_s"]').text_content() != ""
    # The browser asks for /favicon.ico, which the admin pages do not link: not this page's.
    assert [u for u in failed if not u.endswith("/favicon.ico")] == []
    assert [e for e in problems.errors if not e.startswith("console: Failed to load resource")] == []
