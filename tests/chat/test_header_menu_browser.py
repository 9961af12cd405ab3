"""The chat header on a phone in Chromium: at 390 px the conversation's title shows at least
20 characters beside the header's controls, the rarer actions (rename, share, export, delete)
sit in a "More actions" menu worked from the keyboard, and axe finds no violation. Two models
are served, so the model pickers are shown too (on a row of their own)."""

from __future__ import annotations

import pytest

from tests.chat.browser_pages import assert_no_axe_violations, enforce_csp, make_conversation
from tests.chat.test_browser import Problems, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_TITLE = "Planning the garden beds for next spring and summer"

# The width the title's first 20 characters need in the title's own font, against the width
# the title is given: what the eye sees before the ellipsis.
TITLE_ROOM = """() => {
  const title = document.getElementById("conversation-title");
  const probe = document.createElement("span");
  probe.style.font = getComputedStyle(title).font;
  probe.style.whiteSpace = "pre";
  probe.style.position = "absolute";
  probe.textContent = title.textContent.slice(0, 20);
  document.body.appendChild(probe);
  const needed = probe.getBoundingClientRect().width;
  probe.remove();
  const box = title.getBoundingClientRect();
  return { needed, shown: title.clientWidth, right: box.right, left: box.left };
}"""


@pytest.fixture(scope="module")
def browser(multi_model_site):
    with module_chromium() as browser:
        yield browser


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_at_390_px_the_title_shows_20_characters_and_the_menu_works_by_keyboard(
    multi_model_site, browser, scheme
):
    from playwright.sync_api import expect

    url = multi_model_site.url
    desktop = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
    desktop.set_default_timeout(30_000)
    sign_up(desktop.new_page(), url, f"phone-{scheme}")
    conversation_id, _ = make_conversation(
        f"phone-{scheme}",
        [
            {"role": "user", "content": "Beds?"},
            {"role": "assistant", "content": "Four.", "status": "complete"},
        ],
        title=LONG_TITLE,
    )
    phone = browser.new_context(
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        color_scheme=scheme,
        reduced_motion="reduce",
        storage_state=desktop.storage_state(),
    )
    phone.set_default_timeout(30_000)
    enforce_csp(phone)
    page = phone.new_page()
    problems = Problems(page)
    page.goto(f"{url}/c/{conversation_id}/")
    title = page.get_by_role("heading", level=1, name=LONG_TITLE)
    expect(title).to_be_visible()

    room = page.evaluate(TITLE_ROOM)
    assert room["shown"] >= room["needed"] > 0, room
    assert room["left"] >= 0 and room["right"] <= 390, room
    # The controls beside it and the model pickers under it are all on screen.
    expect(page.get_by_label("Model", exact=True)).to_be_visible()
    expect(page.get_by_label("Side by side with")).to_be_visible()
    for name in ("Open sidebar", "Settings", "More actions"):
        box = page.get_by_role("button", name=name).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (name, box)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert_no_axe_violations(page, f"phone header ({scheme})")

    # The menu from the keyboard: ArrowDown opens it on its first item, the arrows walk it
    # (wrapping), End and Home jump, Escape shuts it and gives the focus back.
    toggle = page.get_by_role("button", name="More actions")
    toggle.focus()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    page.keyboard.press("ArrowDown")
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("button", name="Rename")).to_be_focused()
    assert_no_axe_violations(page, f"phone header menu ({scheme})")
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("button", name="Share")).to_be_focused()
    page.keyboard.press("End")
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("button", name="Rename")).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_focused()
    page.keyboard.press("Home")
    expect(page.get_by_role("button", name="Rename")).to_be_focused()
    for item in ("Rename", "Share", "Export as JSON", "Export as Markdown", "Delete"):
        box = page.locator("#conversation-menu").get_by_text(item, exact=True).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (item, box)
    page.keyboard.press("Escape")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(page.locator("#conversation-menu")).to_be_hidden()
    expect(toggle).to_be_focused()

    # An item works from the menu: Rename opens the field, Escape gives the focus back.
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    expect(page.get_by_role("textbox", name="Conversation title")).to_be_focused()
    expect(page.locator("#conversation-menu")).to_be_hidden()
    page.keyboard.press("Escape")
    expect(title).to_be_visible()
    expect(toggle).to_be_focused()
    assert problems.errors == []
    phone.close()
    desktop.close()
