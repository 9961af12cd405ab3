"""Attach files in Chromium (button, drop, paste), ask, see the citation, open the passage."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.chat.browser_pages import assert_no_axe_violations, enforce_csp
from tests.chat.test_browser import ARTIFACTS, CHROMIUM_ARGS, Problems, set_settings, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

GUIDE = (
    "# Lighthouse keeping\n\n## Lamps\n\nThe lamp is lit at sunset and trimmed every four hours.\n\n"
    "## Fog signals\n\nIn fog the keeper sounds the horn twice every minute until the fog lifts.\n"
)


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """A site of its own without ``REDIS_URL``: extraction is a Celery task, which then runs
    eagerly in the site's process, so the test needs no worker on any database."""
    from tests.live_site import launch_live_site, stop_live_site, wait_until_ready

    site = wait_until_ready(
        launch_live_site(tiny_model_dir, tmp_path_factory.mktemp("documents-site"), without=("REDIS_URL",))
    )
    assert httpx.get(f"{site.url}/static/js/chat/attachments.js", timeout=10).status_code == 200
    yield site
    stop_live_site(site)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


DROP = """([selector, name, text]) => {
    const data = new DataTransfer();
    data.items.add(new File([text], name, { type: "text/plain" }));
    const target = document.querySelector(selector);
    for (const type of ["dragover", "drop"]) {
        target.dispatchEvent(new DragEvent(type, { dataTransfer: data, bubbles: true, cancelable: true }));
    }
}"""
PASTE = """([name, text]) => {
    const data = new DataTransfer();
    data.items.add(new File([text], name, { type: "text/plain" }));
    const event = new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true });
    document.getElementById("prompt").dispatchEvent(event);
}"""


def test_attach_ask_see_the_citation_and_open_the_passage(site, browser, tmp_path):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    enforce_csp(context)
    context.set_default_timeout(30_000)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, site.url, "reader")
    page.get_by_role("button", name="New chat").click()
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    set_settings(page, max_tokens=8, temperature=0)

    # The button: a Markdown guide; its chip shows reading progress, then ready.
    guide = tmp_path / "lighthouse.md"
    guide.write_text(GUIDE)
    page.locator("#attach-input").set_input_files(str(guide))
    chips = page.get_by_role("list", name="Attached files")
    expect(chips.locator('li[data-status="ready"]', has_text="lighthouse.md")).to_be_visible(timeout=60_000)
    # Drop and paste: two more files; a binary one fails alone, with its reason on its chip.
    page.evaluate(DROP, ["#composer", "notes.txt", "Buoys mark the channel."])
    page.evaluate(PASTE, ["blob.txt", "\u0000\u0001binary"])
    expect(chips.locator('li[data-status="ready"]', has_text="notes.txt")).to_be_visible(timeout=60_000)
    expect(chips.locator('li[data-status="failed"]', has_text="binary file")).to_be_visible()
    expect(chips.locator('li[data-status="ready"]', has_text="lighthouse.md")).to_be_visible()

    prompt = page.get_by_role("textbox", name="Message")
    prompt.fill("How often does the keeper sound the horn in fog?")
    prompt.press("Enter")
    answer = page.locator("article.msg-assistant.status-complete").last
    expect(answer).to_be_visible(timeout=60_000)
    citation = answer.get_by_role("list", name="Sources").get_by_role("link").first
    expect(citation).to_contain_text("lighthouse.md")
    expect(answer.locator(".citations")).to_contain_text("horn twice every minute")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "documents-citation.png"))
    assert_no_axe_violations(page, "chat with attachments and citations")

    with context.expect_page() as opened:
        citation.click()
    passage_page = opened.value
    passage = passage_page.locator("mark#passage")
    expect(passage).to_contain_text("horn twice every minute")
    expect(passage_page.get_by_role("heading", name="lighthouse.md")).to_be_visible()
    assert_no_axe_violations(passage_page, "passage page")

    # Your files lists all three; the failed one says why; deleting one removes it.
    page.goto(f"{site.url}/settings/documents/")
    expect(page.locator(".data-job")).to_have_count(3)
    expect(page.locator(".data-job.failed")).to_contain_text("binary file")
    assert_no_axe_violations(page, "Your files")
    page.get_by_role("button", name="Delete notes.txt").click()
    expect(page.locator(".data-job")).to_have_count(2)
    assert problems.errors == []
