"""The workspace in Debian's Chromium against the live Daphne server (tiny model), under the
site's CSP: organising the sidebar with the mouse (drag-and-drop) and the keyboard, bulk
actions, the archive, share links read by a second user and refused to an anonymous visitor,
"Continue in my account", temporary chats, ratings, presets and "/", KaTeX math, axe on every
new page and dialog, and phone width.

One browser for the module and two combined walkthroughs: each Chromium start costs seconds.
"""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import assert_no_axe_violations, enforce_csp, make_conversation, wait_until
from tests.chat.test_browser import ARTIFACTS, Problems, in_thread, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MATH_ANSWER = (
    "Inline $x^2 + y^2 = z^2$ and costs $5 and $10.\n\n"
    "$$\n\\int_0^1 x\\,dx = \\frac{1}{2}\n$$\n\n"
    "Hostile: $\\href{javascript:alert(1)}{x}$ and <img src=x onerror=alert(1)>.\n"
)


@pytest.fixture(scope="module")
def browser(live_site):
    with module_chromium() as browser:
        yield browser


def new_page(browser, **options):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, reduced_motion="reduce", **options)
    context.set_default_timeout(30_000)
    enforce_csp(context)
    page = context.new_page()
    return context, page, Problems(page)


def conversation_fields(pk: int) -> dict:
    def read():
        from conversations.models import Conversation

        row = Conversation.all_objects.filter(pk=pk).values(
            "pinned", "folder__name", "archived_at", "deleted_at"
        )
        return row.first()

    return in_thread(read)


def sidebar_item(page, title: str):
    return page.locator(
        "#conversation-list li.conversation-item", has=page.get_by_role("link", name=re.compile(title))
    )


def test_organise_bulk_archive_and_share_between_users(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    ARTIFACTS.mkdir(exist_ok=True)
    context, page, problems = new_page(browser)
    sign_up(page, url, "orga")
    ids = {
        title: make_conversation(
            "orga",
            [
                {"role": "user", "content": f"About {title}"},
                {"role": "assistant", "content": f"{title} answer"},
            ],
            title=title,
        )[0]
        for title in ("Alpha", "Beta", "Gamma", "Delta")
    }
    page.goto(f"{url}/c/{ids['Alpha']}/")
    expect(sidebar_item(page, "Delta")).to_be_visible()

    # A folder, from the keyboard.
    page.get_by_role("button", name="New folder").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("dialog", name="New folder")).to_be_visible()
    page.keyboard.type("Work")
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="Work (0)")).to_be_visible()

    # Drag-and-drop Beta into it.
    sidebar_item(page, "Beta").drag_to(
        page.locator(".conv-group", has=page.get_by_role("button", name="Work (0)"))
    )
    expect(page.get_by_role("button", name="Work (1)")).to_be_visible()
    assert conversation_fields(ids["Beta"])["folder__name"] == "Work"

    # Keyboard only: Gamma's Organise dialog pins it, then moves Delta into the folder.
    page.get_by_role("button", name="Organise “Gamma”").focus()
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="Organise")
    expect(dialog).to_be_visible()
    assert_no_axe_violations(page, "organise dialog")
    dialog.get_by_role("button", name="Pin").focus()
    page.keyboard.press("Enter")
    expect(dialog.get_by_role("button", name="Unpin")).to_be_visible()
    page.keyboard.press("Escape")
    expect(
        page.locator('[data-group="pinned"]').get_by_role("link", name=re.compile("Gamma"))
    ).to_be_visible()
    page.get_by_role("button", name="Organise “Delta”").focus()
    page.keyboard.press("Enter")
    dialog.get_by_label("Folder").select_option(label="Work")
    dialog.get_by_role("button", name="Move").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="Work (2)")).to_be_visible()
    assert conversation_fields(ids["Gamma"])["pinned"] is True
    assert_no_axe_violations(page, "sidebar with pinned chats and a folder")
    page.emulate_media(color_scheme="dark")
    assert_no_axe_violations(page, "sidebar with pinned chats and a folder (dark)")
    page.emulate_media(color_scheme="light")
    page.screenshot(path=ARTIFACTS / "workspace-sidebar.png")

    # Archive Alpha; it leaves the list, the search finds it marked, the archive restores it.
    page.get_by_role("button", name="Organise “Alpha”").click()
    dialog.get_by_role("button", name="Archive").click()
    expect(sidebar_item(page, "Alpha")).to_have_count(0)
    page.get_by_role("searchbox", name="Search conversations").fill("Alpha")
    expect(sidebar_item(page, "Alpha").locator(".archived-mark")).to_have_text("Archived")
    page.get_by_role("searchbox", name="Search conversations").fill("")
    page.get_by_role("button", name="Archived").click()
    expect(sidebar_item(page, "Alpha")).to_be_visible()
    page.get_by_role("button", name="Organise “Alpha”").click()
    dialog.get_by_role("button", name="Restore").click()
    expect(sidebar_item(page, "Alpha")).to_have_count(0)
    page.get_by_role("button", name="Archived").click()
    expect(sidebar_item(page, "Alpha")).to_be_visible()
    assert conversation_fields(ids["Alpha"])["archived_at"] is None

    # Bulk: select two, move them out of the folder, archive them, then delete one.
    page.get_by_role("button", name="Select").click()
    page.get_by_role("checkbox", name="Select “Beta”").check()
    page.get_by_role("checkbox", name="Select “Delta”").check()
    expect(page.get_by_text("2 selected")).to_be_visible()
    assert_no_axe_violations(page, "bulk selection")
    page.get_by_label("Move to folder").select_option(label="Out of folders")
    page.get_by_role("button", name="Move", exact=True).click()
    expect(page.get_by_role("button", name="Work (0)")).to_be_visible()
    page.get_by_role("checkbox", name="Select “Beta”").check()
    page.get_by_role("checkbox", name="Select “Delta”").check()
    page.locator("#bulk-archive").click()
    expect(sidebar_item(page, "Beta")).to_have_count(0)
    expect(sidebar_item(page, "Delta")).to_have_count(0)
    page.get_by_role("checkbox", name="Select “Alpha”").check()
    page.locator("#bulk-delete").click()
    page.get_by_role("dialog", name="Delete 1 chat?").get_by_role("button", name="Delete").click()
    expect(sidebar_item(page, "Alpha")).to_have_count(0)
    assert conversation_fields(ids["Alpha"])["deleted_at"] is not None
    assert conversation_fields(ids["Beta"])["archived_at"] is not None
    page.get_by_role("button", name="Done").click()

    # Share Gamma: the link, my shares, then a second user reads it and continues it.
    page.get_by_role("link", name=re.compile("Gamma")).click()
    expect(page.locator("article.msg-assistant")).to_contain_text("Gamma answer")
    page.get_by_role("button", name="More actions").click()
    page.get_by_role("button", name="Share").click()
    share_dialog = page.get_by_role("dialog", name="Share a link")
    expect(share_dialog).to_be_visible()
    link = page.locator("#share-url").input_value()
    assert re.search(r"/s/[\w-]{20,}/$", link), link
    assert_no_axe_violations(page, "share dialog")
    page.keyboard.press("Escape")
    page.goto(f"{url}/shares/")
    expect(page.get_by_role("link", name=link)).to_be_visible()
    assert_no_axe_violations(page, "my shares")

    reader_context, reader, reader_problems = new_page(browser)
    sign_up(reader, url, "reader")
    reader.goto(link)
    expect(reader.get_by_role("heading", name="Gamma")).to_be_visible()
    expect(reader.get_by_role("article", name="Answer")).to_contain_text("Gamma answer")
    assert reader.locator('meta[name="robots"]').get_attribute("content") == "noindex, nofollow"
    assert "orga" not in reader.content()
    assert_no_axe_violations(reader, "shared page")
    reader.get_by_role("button", name="Continue in my account").click()
    reader.wait_for_url(re.compile(r"/c/\d+/$"))
    expect(reader.locator("article.msg-assistant")).to_contain_text("Gamma answer")
    expect(reader.get_by_role("link", name=re.compile("Gamma"))).to_be_visible()  # in the reader's own list

    anonymous = browser.new_context()
    visitor = anonymous.new_page()
    visitor.goto(link)
    assert "/accounts/login/" in visitor.url
    anonymous.close()

    assert reader_problems.errors == []

    # Revoked: the reader's next visit is a 410 saying so.
    page.get_by_role("button", name="Revoke the link to Gamma").click()
    expect(page.get_by_text(re.compile("Revoked"))).to_be_visible()
    assert reader.goto(link).status == 410
    expect(reader.get_by_role("heading", name="This share link was revoked")).to_be_visible()

    assert problems.errors == []
    reader_context.close()
    context.close()


def test_temporary_chat_rating_presets_slash_math_and_phone_width(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    context, page, problems = new_page(browser)
    sign_up(page, url, "temp")

    # A preset, from its page.
    page.goto(f"{url}/settings/presets/")
    assert_no_axe_violations(page, "presets page")
    page.get_by_label("Name").fill("Pirate")
    page.get_by_label("System prompt").fill("Answer like a pirate.")
    page.get_by_label("Max tokens").fill("8")
    page.get_by_role("button", name="Save preset").click()
    expect(page.get_by_text("Saved the preset “Pirate”.")).to_be_visible()

    # A temporary chat started with the preset: marked, not listed, gone once left.
    page.goto(f"{url}/")
    page.get_by_label("Preset").select_option(label="Pirate")
    page.get_by_role("button", name="Temporary chat").click()
    expect(page.get_by_role("button", name="Temporary chat")).to_have_attribute("aria-pressed", "true")
    expect(page.get_by_role("note")).to_contain_text("Temporary chat")
    assert_no_axe_violations(page, "empty chat with start options")
    prompt = page.get_by_role("textbox", name="Message")
    prompt.fill("Ahoy?")
    page.keyboard.press("Enter")
    expect(page.locator("article.msg-assistant").last).to_have_class(
        re.compile("status-complete"), timeout=60_000
    )
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    temporary_id = int(re.search(r"/c/(\d+)/", page.url).group(1))
    expect(page.get_by_role("note")).to_be_visible()
    expect(page.locator("#conversation-list a")).to_have_count(0)

    def fields():
        from conversations.models import Conversation

        return (
            Conversation.all_objects.filter(pk=temporary_id)
            .values("temporary", "system_prompt", "deleted_at")
            .first()
        )

    row = in_thread(fields)
    assert row["temporary"] and row["system_prompt"] == "Answer like a pirate."

    # A saved conversation with math and a regenerated answer to rate.
    conversation_id, ids = make_conversation(
        "temp",
        [
            {"role": "user", "content": "Maths?"},
            {"role": "assistant", "content": MATH_ANSWER, "status": "complete"},
        ],
        title="Maths",
    )
    page.goto(f"{url}/c/{conversation_id}/")
    wait_until(page, lambda: in_thread(fields)["deleted_at"] is not None)  # the tab left it
    answer = page.locator("article.msg-assistant")
    expect(answer.locator("math")).to_have_count(3)
    expect(answer.locator('math[display="block"]')).to_have_count(1)
    assert answer.locator("img").count() == 0 and answer.locator("[href^='javascript']").count() == 0
    assert "costs $5 and $10" in answer.inner_text()
    expect(page.get_by_role("note")).to_be_hidden()

    # Rating from the keyboard, with a reason.
    answer.get_by_role("button", name="Bad answer").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("dialog")).to_be_visible()
    assert_no_axe_violations(page, "rating dialog and math")
    page.keyboard.type("Too long")
    page.get_by_role("button", name="Send feedback").click()
    expect(answer.get_by_role("button", name="Bad answer")).to_have_attribute("aria-pressed", "true")

    def rating():
        from conversations.models import Rating

        return list(Rating.objects.values_list("message_id", "value", "reason"))

    wait_until(page, lambda: rating() == [(ids[1], -1, "Too long")])
    page.screenshot(path=ARTIFACTS / "workspace-math-and-rating.png")

    # "/" lists saved prompts; Enter inserts one.
    prompt.focus()
    page.keyboard.type("/pir")
    option = page.get_by_role("option", name=re.compile("Pirate"))
    expect(option).to_have_attribute("aria-selected", "true")
    page.keyboard.press("Enter")
    expect(prompt).to_have_value("Answer like a pirate.")
    expect(page.get_by_role("listbox")).to_be_hidden()

    # Closing the tab closes a temporary chat too (pagehide sends a beacon).
    other = context.new_page()
    other.goto(f"{url}/")
    other.get_by_role("button", name="Temporary chat").click()
    other.get_by_role("button", name="New chat").click()
    other.wait_for_url(re.compile(r"/c/\d+/$"))
    closed_id = int(re.search(r"/c/(\d+)/", other.url).group(1))

    def closed():
        from conversations.models import Conversation

        row = Conversation.all_objects.filter(pk=closed_id).values("temporary", "deleted_at").first()
        return row is not None and row["temporary"] and row["deleted_at"] is not None

    assert not in_thread(closed)
    other.close(run_before_unload=True)
    wait_until(page, lambda: in_thread(closed))

    # Phone width: the grouped sidebar and the new controls fit.
    phone = browser.new_context(
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        storage_state=context.storage_state(),
    )
    phone_page = phone.new_page()
    phone_problems = Problems(phone_page)
    phone_page.goto(f"{url}/c/{conversation_id}/")
    expect(phone_page.locator("article.msg-assistant math").first).to_be_visible()
    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    phone_page.get_by_role("button", name="Open sidebar").click()
    expect(phone_page.get_by_role("button", name="New folder")).to_be_visible()
    assert_no_axe_violations(phone_page, "phone sidebar with the organise bar")
    phone_page.screenshot(path=ARTIFACTS / "workspace-phone-sidebar.png")
    phone_page.goto(f"{url}/settings/presets/")
    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    phone.close()

    assert problems.errors == [] and phone_problems.errors == []
    context.close()
