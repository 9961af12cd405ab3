"""The chat's tool flow in Debian's Chromium against a live Daphne server whose model is
scripted to call the built-in calculator and then answer: tools turned on in the settings, the
call shown as a step with its result, and a call that waits for the user's approval."""

from __future__ import annotations

import re

import pytest

from conversations.models import McpServer
from tests.chat.test_browser import ARTIFACTS, Problems, sign_up
from tests.support.tool_model import TOOL_ANSWER

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def tool_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    from tests.live_site import start_live_site, stop_live_site

    site = start_live_site(
        tiny_model_dir,
        tmp_path_factory.mktemp("tool-site"),
        ENGINE_LOADER="tests.support.tool_model.scripted_tool_model",
        ENGINE_KV_CACHE_GB="0.0001",  # the scripted model's blocks are tiny: a small pool of them
    )
    yield site
    stop_live_site(site)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "tool-site.log").write_text(site.log())


@pytest.fixture
def patient_expect():
    """Each answer first lists the tools (the built-in server starts for it) on a busy machine."""
    from playwright.sync_api import expect

    expect.set_options(timeout=90_000)
    yield
    expect.set_options(timeout=5_000)  # Playwright's default, for the tests after this one


@pytest.fixture
def builtin_tools(transactional_db):
    """The built-in server open to all (made before Playwright's loop runs in this thread)."""
    McpServer.objects.update_or_create(
        name="Built-in tools", defaults={"transport": "builtin", "all_users": True, "enabled": True}
    )


@pytest.fixture
def browser(builtin_tools):
    from playwright.sync_api import sync_playwright

    from tests.chat.test_browser import CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def switch_settings(page, **switches: bool) -> None:
    from playwright.sync_api import expect

    labels = {"tools": "Let the model use tools", "approval": "Ask me before each tool call"}
    page.get_by_role("button", name="Settings").click()
    for name, on in switches.items():
        page.get_by_label(labels[name]).set_checked(on)
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status").filter(has_text="Saved")).to_be_visible()
    page.get_by_role("button", name="Close", exact=True).click()


def ask(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message", exact=True)
    box.fill(text)
    box.press("Enter")


def answered(page, count: int) -> None:
    """The thread holds ``count`` final answers and nothing is being written any more."""
    from playwright.sync_api import expect

    expect(page.locator("article.msg-assistant", has_text=TOOL_ANSWER)).to_have_count(count)
    expect(page.locator("article.msg.status-streaming")).to_have_count(0)


def test_a_tool_call_shows_as_a_step_with_its_result_and_can_wait_for_approval(
    tool_site, browser, patient_expect
):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(90_000)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, tool_site.url, "toolfan")

    switch_settings(page, tools=True)
    ask(page, "What is 6*7?")
    step = page.locator("article.msg-tool").first
    expect(step.locator("summary")).to_have_text(re.compile(r"^Ran calculator in \d"))
    answered(page, 1)
    result = step.locator(".tool-result pre")
    expect(result).to_be_hidden()  # folded until opened
    step.locator("summary").click()
    expect(result).to_have_text("42")
    expect(step.locator(".tool-arguments pre")).to_contain_text('"expression": "6*7"')
    expect(page.locator("article.msg-assistant").first).to_contain_text("Calling calculator")
    page.screenshot(path=str(ARTIFACTS / "chat-tool-step.png"), full_page=True)
    step.locator("summary").click()
    expect(result).to_be_hidden()

    switch_settings(page, approval=True)
    ask(page, "And once more, but ask me first.")
    waiting = page.locator("article.msg-tool").nth(1)
    expect(waiting.locator("summary")).to_have_text("calculator wants to run")
    expect(waiting.locator(".tool-arguments pre")).to_be_visible()  # open while it waits
    page.screenshot(path=str(ARTIFACTS / "chat-tool-approval.png"), full_page=True)
    waiting.get_by_role("button", name="Allow calculator").click()
    expect(waiting.locator("summary")).to_have_text(re.compile(r"^Ran calculator"))
    answered(page, 2)

    ask(page, "Once more, and I will say no.")
    denied = page.locator("article.msg-tool").nth(2)
    denied.get_by_role("button", name="Deny calculator").click()
    expect(denied.locator("summary")).to_have_text("calculator was not allowed")
    answered(page, 3)
    assert problems.errors == []
    context.close()
