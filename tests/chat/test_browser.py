"""The whole chat flow in Debian's Chromium against a live Daphne server (tiny model, slowed).

Screenshots of the desktop (1280 px) and phone (390 px) layouts go to test-artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.support.browser import CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PASSWORD = "correct-horse-battery-9"


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """A site whose forward passes take at least 10 ms each: the tiny model alone finishes a
    1,500-token answer before the walk reaches its Stop button."""
    from tests.live_site import start_slow_live_site, stop_live_site

    live = start_slow_live_site(tiny_model_dir, tmp_path_factory.mktemp("browser-site"))
    assert httpx.get(f"{live.url}/static/js/chat/main.js", timeout=10).status_code == 200
    yield live
    stop_live_site(live)


@pytest.fixture
def browser():
    """Per test: Playwright's sync API keeps an event loop running in this thread, and the
    database teardown after each test must not run inside it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Problems:
    """JavaScript errors and failed requests seen by a page, and what the CSP blocked
    (``blocked``: each a console error too, except the one expected case below)."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.blocked: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", self._console)

    def _console(self, msg) -> None:
        if msg.type != "error":
            return
        if "Content Security Policy" in msg.text:
            self.blocked.append(msg.text)
            # DOMPurify parses hostile HTML with DOMParser, and Chromium reports the inline
            # handlers it meets there (an <img onerror>) as blocked by the page's CSP, though
            # that document never runs them. The CSP doing its job is not a page error.
            if msg.location.get("url", "").endswith("/dompurify-3.5.0/purify.min.js"):
                return
        self.errors.append(f"console: {msg.text}")


def sign_up(page, url: str, username: str) -> None:
    page.goto(f"{url}/accounts/signup/")
    page.locator("#id_username").fill(username)
    page.locator("#id_password1").fill(PASSWORD)
    page.locator("#id_password2").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.wait_for_url(f"{url}/")


def set_settings(page, **values) -> None:
    from playwright.sync_api import expect

    page.get_by_role("button", name="Settings").click()
    labels = {"max_tokens": "Max tokens", "temperature": "Temperature"}
    for name, value in values.items():
        page.get_by_label(labels[name]).fill(str(value))
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status").filter(has_text="Saved")).to_be_visible()
    page.get_by_role("button", name="Close", exact=True).click()


def answer_lengths_over_frames(page, frames: int = 90) -> list[int]:
    """The last answer's text length at each of the next ``frames`` animation frames."""
    return page.evaluate(
        """async (frames) => {
            const lengths = [];
            for (let i = 0; i < frames; i++) {
                await new Promise((resolve) => requestAnimationFrame(resolve));
                const answers = document.querySelectorAll('.msg-assistant .msg-content');
                const last = answers[answers.length - 1];
                lengths.push(last ? last.textContent.length : 0);
                if (!document.querySelector('.msg.status-streaming') && lengths.length > 3) break;
            }
            return lengths;
        }""",
        frames,
    )


def thread_json(page, url: str, conversation_id: int) -> dict:
    response = page.request.get(f"{url}/chat/conversations/{conversation_id}/")
    assert response.ok
    return response.json()


def test_a_new_user_walks_the_whole_chat_flow_and_another_user_sees_none_of_it(site, browser):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    url = site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(30_000)
    page = context.new_page()
    problems = Problems(page)
    last_answer = page.locator("article.msg-assistant").last
    send, stop = page.get_by_role("button", name="Send"), page.get_by_role("button", name="Stop")

    # Sign up, new chat, settings for a long answer.
    sign_up(page, url, "walker")
    expect(page.get_by_role("heading", name="How can I help?")).to_be_visible()
    page.get_by_role("button", name="New chat").click()
    page.wait_for_url(re.compile(r"/c/\d+/$"))
    conversation_id = int(re.search(r"/c/(\d+)/", page.url).group(1))
    set_settings(page, max_tokens=1500, temperature=0)

    # Send with Enter (Shift+Enter is a new line); the answer grows across frames; Stop.
    prompt = page.get_by_role("textbox", name="Message")
    prompt.fill("Hello there")
    prompt.press("Shift+Enter")
    prompt.press_sequentially("How are you?")
    assert prompt.input_value() == "Hello there\nHow are you?"
    prompt.press("Enter")
    expect(stop).to_be_visible()
    expect(send).to_be_hidden()
    expect(page.locator(".msg-assistant .cursor")).to_be_visible()
    lengths = answer_lengths_over_frames(page)
    # Markdown may re-flow a little (a closing "**"), but the answer keeps growing.
    assert len(set(lengths)) >= 3 and lengths[-1] > lengths[0], lengths
    stop.click()
    expect(last_answer).to_have_class(re.compile("status-interrupted"))
    expect(last_answer.locator(".msg-meta")).to_contain_text("Stopped")
    expect(send).to_be_visible()
    stopped_text = last_answer.locator(".msg-content").inner_text()
    assert stopped_text.strip()
    stopped = thread_json(page, url, conversation_id)["messages"][-1]
    assert stopped["status"] == "interrupted" and 0 < stopped["completion_tokens"] < 1500
    # Size the next answers to this machine: about four seconds each, but small enough that
    # the path (question, answer, follow-up, longer answer) stays inside the tiny model's
    # 2048-token context, or a fast machine stops the last answer at the context limit.
    rate = stopped["tokens_per_s"] or 50
    short_answer = max(60, min(600, int(rate * 4)))
    long_answer = max(120, min(1000, int(rate * 8)))
    set_settings(page, max_tokens=short_answer)

    # Edit the question: a second branch, "2/2"; its answer streams and completes.
    page.locator("article.msg-user").get_by_role("button", name="Edit").click()
    editor = page.get_by_role("textbox", name="Edit message")
    editor.fill("Hello again")
    page.get_by_role("button", name="Save & submit").click()
    user_switcher = page.locator("article.msg-user .switcher")
    expect(user_switcher).to_contain_text("2/2")
    expect(send).to_be_visible(timeout=90_000)
    expect(last_answer).to_have_class(re.compile("status-complete"))

    # Back to branch 1/2: the old question and its stopped answer.
    page.get_by_role("button", name="Previous branch").click()
    expect(user_switcher).to_contain_text("1/2")
    expect(page.locator("article.msg-user .msg-text")).to_have_text("Hello there\nHow are you?")
    expect(last_answer.locator(".msg-content")).to_have_text(stopped_text)
    page.get_by_role("button", name="Next branch").click()
    expect(user_switcher).to_contain_text("2/2")
    expect(page.locator("article.msg-user .msg-text")).to_have_text("Hello again")

    # Regenerate the answer: a sibling answer, "2/2" on it.
    last_answer.get_by_role("button", name="Regenerate").click()
    expect(last_answer.locator(".switcher")).to_contain_text("2/2")
    expect(send).to_be_visible(timeout=90_000)
    expect(last_answer).to_have_class(re.compile("status-complete"))
    page.screenshot(path=ARTIFACTS / "chat-desktop-1280.png")

    # Rename.
    page.get_by_role("button", name="More actions").click()
    page.get_by_role("button", name="Rename").click()
    page.get_by_role("textbox", name="Conversation title").fill("Walkthrough chat")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.get_by_role("heading", name="Walkthrough chat")).to_be_visible()
    expect(page.locator(".conversation-link.active")).to_contain_text("Walkthrough chat")

    # Reload in the middle of an answer: the text so far comes back, then it finishes.
    set_settings(page, max_tokens=long_answer)
    prompt.fill("Tell me more")
    prompt.press("Enter")
    expect(stop).to_be_visible()
    expect(page.locator(".msg-assistant .cursor")).to_be_visible()
    page.wait_for_function(
        "() => { const a = document.querySelectorAll('.msg-assistant .msg-content');"
        " return a.length && a[a.length - 1].textContent.length > 20; }"
    )
    page.reload()
    resumed = thread_json(page, url, conversation_id)["messages"][-1]
    expect(page.get_by_role("heading", name="Walkthrough chat")).to_be_visible()
    expect(send).to_be_visible(timeout=90_000)
    expect(last_answer).to_have_class(re.compile("status-complete"))
    final = thread_json(page, url, conversation_id)["messages"][-1]
    assert final["id"] == resumed["id"] and final["status"] == "complete"
    assert final["content"].startswith(resumed["content"])
    assert final["completion_tokens"] == long_answer
    expect(last_answer.locator(".msg-meta")).to_contain_text(f"{final['completion_tokens']} tokens")
    expect(last_answer.locator(".cursor")).to_have_count(0)

    # The phone layout, and its sidebar.
    phone = browser.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
        storage_state=context.storage_state(),
    )
    phone_page = phone.new_page()
    phone_problems = Problems(phone_page)
    phone_page.goto(f"{url}/c/{conversation_id}/")
    expect(phone_page.get_by_role("button", name="Send")).to_be_visible()
    expect(phone_page.get_by_role("button", name="Open sidebar")).to_be_visible()
    width = phone_page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the phone layout scrolls sideways ({width}px)"
    phone_page.locator("article.msg-user").last.evaluate("(el) => el.scrollIntoView({block: 'start'})")
    phone_page.screenshot(path=ARTIFACTS / "chat-phone-390.png")
    phone_page.get_by_role("button", name="Open sidebar").click()
    expect(phone_page.get_by_role("link", name=re.compile("Walkthrough chat"))).to_be_visible()
    phone_page.wait_for_timeout(300)  # the slide-in transition
    phone_page.screenshot(path=ARTIFACTS / "chat-phone-390-sidebar.png")
    phone.close()

    # A second user sees none of it.
    other = browser.new_context()
    other_page = other.new_page()
    sign_up(other_page, url, "stranger")
    assert other_page.goto(f"{url}/c/{conversation_id}/").status == 404
    assert other_page.request.get(f"{url}/chat/conversations/{conversation_id}/").status == 404
    other_page.goto(f"{url}/")
    expect(other_page.get_by_text("No conversations yet.")).to_be_visible()
    assert "Walkthrough" not in other_page.content()
    other.close()

    # Delete the conversation.
    page.get_by_role("button", name="More actions").click()
    page.get_by_role("button", name="Delete", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Walkthrough chat")
    dialog.get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{url}/")
    expect(page.get_by_role("link", name=re.compile("Walkthrough chat"))).to_have_count(0)
    assert page.request.get(f"{url}/chat/conversations/{conversation_id}/").status == 404

    assert problems.errors == [] and phone_problems.errors == []
    context.close()


def in_thread(function, *args):
    """Run ORM code off Playwright's event-loop thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function, *args).result()


def test_answers_are_sanitised_markdown_with_highlighted_code_and_copy_buttons(site, browser):
    from playwright.sync_api import expect

    from conversations.models import Conversation, Message

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, site.url, "markdown")
    answer = (
        '## Plan\n\nSome **bold** text <img src="data:," onerror="window.pwned=1">'
        "<script>window.pwned=2</script> [a link](javascript:window.pwned=3)\n\n"
        "```python\ndef greet():\n    return 'hi'\n```\n"
    )

    def make_conversation() -> int:
        from django.contrib.auth import get_user_model

        owner = get_user_model().objects.get(username="markdown")
        conversation = Conversation.objects.create(owner=owner, title="Markdown")
        question = Message.objects.create(conversation=conversation, role="user", content="<b>not bold</b>")
        reply = Message.objects.create(
            conversation=conversation, parent=question, role="assistant", content=answer
        )
        Conversation.objects.filter(pk=conversation.pk).update(current_leaf=reply)
        return conversation.pk

    conversation_id = in_thread(make_conversation)
    page.goto(f"{site.url}/c/{conversation_id}/")
    reply = page.locator("article.msg-assistant")
    expect(reply.get_by_role("heading", name="Plan")).to_be_visible()
    expect(reply.locator("strong")).to_have_text("bold")
    expect(page.locator("article.msg-user .msg-text")).to_have_text("<b>not bold</b>")  # user text is text
    assert page.evaluate("window.pwned") is None
    assert reply.locator("img[onerror], script").count() == 0
    assert reply.locator("a").get_attribute("href") in (None, "")
    expect(reply.locator("pre code.hljs")).to_be_visible()
    expect(reply.locator(".code-head")).to_contain_text("python")

    reply.get_by_role("button", name="Copy code").click()
    assert page.evaluate("navigator.clipboard.readText()") == "def greet():\n    return 'hi'\n"
    reply.get_by_role("button", name="Copy", exact=True).click()
    assert page.evaluate("navigator.clipboard.readText()") == answer
    assert problems.errors == []
    # Even an inline handler that reached the live page would not run: the CSP blocks it.
    probe = """() => new Promise((done) => {
        const img = document.createElement("img");
        img.setAttribute("onerror", "window.cspProbe = 1");
        img.src = "data:,not-an-image";
        document.body.append(img);
        setTimeout(() => done(window.cspProbe === undefined), 500);
    })"""
    assert page.evaluate(probe) is True
    assert any("inline event handler" in text for text in problems.blocked)
    context.close()
