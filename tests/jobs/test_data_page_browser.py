"""The data page in Debian's Chromium at phone width: nothing scrolls sideways, export and
import work from it. Screenshot in test-artifacts/data-phone-390.png."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chat.test_browser import ARTIFACTS, Problems, browser, sign_up  # noqa: F401  (fixture)

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_data_page_works_at_phone_width(live_site, browser):  # noqa: F811
    from playwright.sync_api import expect

    url = live_site.url
    phone = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True
    )
    page = phone.new_page()
    problems = Problems(page)
    sign_up(page, url, "mobile-data")
    page.goto(f"{url}/settings/data/")
    expect(page.get_by_role("heading", name="Your data")).to_be_visible()
    export_button = page.get_by_role("button", name="Export all")
    import_button = page.get_by_role("button", name="Import")
    expect(export_button).to_be_visible()
    expect(import_button).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the data page scrolls sideways at phone width ({width}px)"

    with page.expect_download() as download:
        export_button.click()
    assert download.value.suggested_filename == "conversations.json"

    page.get_by_label("File").set_input_files(str(FIXTURES / "chatgpt_branches.json"))
    import_button.click()
    page.wait_for_url(f"{url}/settings/data/")
    # Eager here (SQLite run) it is done at once; with a broker and no worker it waits its turn.
    expect(page.locator(".data-job").first).to_contain_text(re.compile("Imported 2 conversations|Working"))
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "data-phone-390.png", full_page=True)
    assert problems.errors == []
    phone.close()
