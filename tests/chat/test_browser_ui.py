"""The browser UI in Debian's Chromium against the live Daphne server (tiny model): axe-core on every
page in light and dark mode, a keyboard-only walkthrough, sanitised hostile answers, and the client
side of the websocket contracts in docs/interfaces.md (watchdog, errors, reasoning, fork, titles).

One live server (the session's) and one browser for the module (split by area, each module would
start its own browser, seconds each on two cores); the page helpers are in ``browser_pages``.
"""

from __future__ import annotations

import re

import pytest

from tests.chat.browser_pages import (
    RoutedSocket,
    assert_no_axe_violations,
    enforce_csp,
    make_conversation,
    share_conversation,
    update_conversation,
    wait_until,
)
from tests.chat.test_browser import ARTIFACTS, Problems, sign_up
from tests.support.browser import module_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MARKDOWN_ANSWER = (
    "## Plan\n\nSome **bold** and *emphasis*, a [link](https://example.com/docs), `inline code`.\n\n"
    "- one\n- two\n\n> a quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    "```python\ndef greet():\n    return 'hi'\n```\n"
)


@pytest.fixture(scope="module")
def browser(live_site):
    with module_chromium() as browser:
        yield browser


# --- axe-core ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_has_no_axe_violations(live_site, browser, scheme):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    url = live_site.url
    context = browser.new_context(
        viewport={"width": 1280, "height": 800}, color_scheme=scheme, reduced_motion="reduce"
    )
    context.set_default_timeout(30_000)
    page = context.new_page()
    problems = Problems(page)

    page.goto(f"{url}/accounts/login/")
    assert_no_axe_violations(page, f"login ({scheme})")
    page.goto(f"{url}/accounts/signup/")
    assert_no_axe_violations(page, f"signup ({scheme})")
    sign_up(page, url, f"axe-{scheme}")
    expect(page.get_by_role("heading", name="How can I help?")).to_be_visible()
    assert_no_axe_violations(page, f"empty chat ({scheme})")
    page.keyboard.press("Control+/")
    expect(page.get_by_role("dialog", name="Keyboard shortcuts")).to_be_visible()
    assert_no_axe_violations(page, f"shortcuts dialog ({scheme})")
    page.keyboard.press("Escape")

    # A saved Markdown answer with a code block, then a streamed answer after it.
    conversation_id, _ = make_conversation(
        f"axe-{scheme}",
        [
            {"role": "user", "content": "Show me"},
            {"role": "assistant", "content": MARKDOWN_ANSWER, "status": "complete"},
        ],
        max_tokens=12,
    )
    page.goto(f"{url}/c/{conversation_id}/")
    expect(page.locator("article.msg-assistant pre code.hljs")).to_be_visible()
    page.get_by_role("textbox", name="Message").fill("And now?")
    page.keyboard.press("Enter")
    expect(page.locator("article.msg-assistant")).to_have_count(2)
    expect(page.locator("article.msg-assistant").last).to_have_class(
        re.compile("status-complete"), timeout=60_000
    )
    page.get_by_role("button", name="More actions").click()
    expect(page.get_by_role("link", name="Export as JSON")).to_have_attribute(
        "href", f"/conversations/{conversation_id}/export.json"
    )
    assert_no_axe_violations(page, f"chat with answers and the actions menu ({scheme})")
    page.keyboard.press("Escape")
    page.screenshot(path=ARTIFACTS / f"chat-{scheme}-1280.png")

    page.goto(f"{url}/settings/api-keys/")
    page.get_by_role("textbox", name="Name (optional)").fill("laptop")
    page.get_by_role("button", name="Create key").click()
    expect(page.get_by_role("heading", name="Your new key")).to_be_visible()
    assert_no_axe_violations(page, f"API keys ({scheme})")

    # The workspace's pages: presets, my shared links, and a shared conversation.
    token = share_conversation(conversation_id)
    for path, name in (
        ("/settings/presets/", "presets"),
        ("/shares/", "shared links"),
        (f"/s/{token}/", "shared"),
    ):
        page.goto(f"{url}{path}")
        assert_no_axe_violations(page, f"{name} page ({scheme})")

    # Phone width: the shut drawer is out of the tab order, the open one is not cut at the left.
    phone = browser.new_context(
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        color_scheme=scheme,
        reduced_motion="reduce",
        storage_state=context.storage_state(),
    )
    phone_page = phone.new_page()
    phone_problems = Problems(phone_page)
    phone_page.goto(f"{url}/c/{conversation_id}/")
    expect(phone_page.locator("article.msg-assistant").first).to_be_visible()
    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    # The export menu fits the phone's screen.
    phone_page.get_by_role("button", name="More actions").click()
    menu = phone_page.get_by_role("link", name="Export as Markdown").bounding_box()
    assert menu["x"] >= 0 and menu["x"] + menu["width"] <= 390, menu
    phone_page.keyboard.press("Escape")
    # Reduced motion: the drawer does not slide.
    assert (
        phone_page.evaluate("getComputedStyle(document.getElementById('sidebar')).transitionDuration") == "0s"
    )
    assert_no_axe_violations(phone_page, f"phone chat ({scheme})")
    for _ in range(12):
        phone_page.keyboard.press("Tab")
        assert phone_page.evaluate("!document.getElementById('sidebar').contains(document.activeElement)")
    phone_page.get_by_role("button", name="Open sidebar").click()
    new_chat = phone_page.get_by_role("button", name="New chat")
    expect(new_chat).to_be_visible()
    box, brand = new_chat.bounding_box(), phone_page.locator(".brand").bounding_box()
    assert box["x"] >= 4 and brand["x"] >= 4, (box, brand)
    assert phone_page.evaluate("document.getElementById('main').inert")
    assert_no_axe_violations(phone_page, f"phone sidebar ({scheme})")
    phone_page.screenshot(path=ARTIFACTS / f"chat-phone-390-sidebar-{scheme}.png")
    phone_page.keyboard.press("Escape")
    expect(phone_page.get_by_role("button", name="Open sidebar")).to_be_focused()
    phone.close()

    assert problems.errors == [] and phone_problems.errors == []
    context.close()


# --- Keyboard only --------------------------------------------------------------------------


NO_POINTER = """
window.__pointerEvents = 0;
for (const type of ["pointerdown", "mousedown", "mouseup", "touchstart"]) {
  window.addEventListener(type, () => window.__pointerEvents++, true);
}
"""


def tab_to(page, label: str, *, backwards: bool = True, limit: int = 25) -> None:
    """Press (Shift+)Tab until the focused control is named ``label``."""
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
        if page.evaluate("document.activeElement.getAttribute('aria-label')") == label:
            return
    raise AssertionError(f"Tab never reached {label!r}")


def test_keyboard_only_send_stop_edit_regenerate_switch_and_delete(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(60_000)
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, url, "keys")
    conversation_id, _ = make_conversation("keys", [], title="Keyboard chat", max_tokens=1500, temperature=0)
    page.add_init_script(NO_POINTER)
    page.goto(f"{url}/c/{conversation_id}/")
    prompt = page.get_by_role("textbox", name="Message")
    expect(prompt).to_be_focused()
    focused_id = "() => document.activeElement.id"
    answer = page.locator("article.msg-assistant").last

    # Send, then Esc stops; the focus stays in the composer and the state is named for screen readers.
    page.keyboard.type("Hello there")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status", name="Answer generating")).to_be_visible()
    page.wait_for_function(
        "() => (document.querySelector('.msg-assistant .msg-content') || {}).textContent?.length > 10"
    )
    page.keyboard.press("Escape")
    expect(answer).to_have_class(re.compile("status-interrupted"), timeout=30_000)
    expect(answer.get_by_role("status", name="Answer stopped")).to_be_visible()
    expect(page.locator("#announcer")).to_have_text("Answer stopped.")
    assert page.evaluate(focused_id) == "prompt"
    update_conversation(conversation_id, max_tokens=16)

    # ↑ in the empty composer edits the last message; Enter submits a new branch.
    page.keyboard.press("ArrowUp")
    editor = page.get_by_role("textbox", name="Edit message")
    expect(editor).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("Hello again")
    page.keyboard.press("Enter")
    expect(page.locator("article.msg-user .switch-label")).to_have_text("2/2")
    expect(answer).to_have_class(re.compile("status-complete"), timeout=90_000)
    expect(page.locator("#announcer")).to_contain_text("Answer:", timeout=10_000)
    assert page.evaluate(focused_id) == "prompt"

    # Regenerate: Shift+Tab back from the composer to the answer's button, Enter.
    tab_to(page, "Regenerate")
    page.keyboard.press("Enter")
    expect(answer.locator(".switch-label")).to_have_text("2/2")
    expect(answer).to_have_class(re.compile("status-complete"), timeout=90_000)

    # Switch branches: Enter on "Previous branch", then → on the focused branch control.
    page.keyboard.press("Shift+Escape")
    tab_to(page, "Previous branch")
    page.keyboard.press("Enter")
    expect(answer.locator(".switch-label")).to_have_text("1/2")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Next branch"
    page.keyboard.press("ArrowRight")
    expect(answer.locator(".switch-label")).to_have_text("2/2")

    # The shortcuts: help (focus returns on close), search, new chat.
    page.keyboard.press("Shift+Escape")
    page.keyboard.press("Control+/")
    help_dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(help_dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(help_dialog).to_be_hidden()
    # The dialog's "close" event (which gives the focus back) is a task queued after Escape:
    # let it run before the next shortcut, or it would take the focus from the search box.
    page.evaluate("() => new Promise((resolve) => setTimeout(resolve, 50))")
    assert page.evaluate(focused_id) == "prompt"
    page.keyboard.press("Control+k")
    assert page.evaluate(focused_id) == "search"
    page.keyboard.press("Shift+Escape")

    # Delete the conversation: the confirmation opens on Cancel; Tab to Delete, Enter.
    page.keyboard.press("Control+Shift+Backspace")
    dialog = page.get_by_role("dialog", name="Delete this chat?")
    expect(dialog).to_be_visible()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{url}/")
    expect(page.get_by_role("link", name=re.compile("Keyboard chat"))).to_have_count(0)
    assert page.request.get(f"{url}/chat/conversations/{conversation_id}/").status == 404
    assert page.evaluate(focused_id) == "prompt"
    page.keyboard.press("Control+Shift+O")
    page.wait_for_url(re.compile(r"/c/\d+/$"))

    assert page.evaluate("window.__pointerEvents") == 0
    assert problems.errors == []
    context.close()


# --- Sanitising -------------------------------------------------------------------------------

HOSTILE = (
    "# Title\n\n"
    '<script>window.pwned = 1</script><img src="data:," onerror="window.pwned = 2">\n\n'
    '<iframe src="https://evil.example/frame"></iframe><style>body { display: none }</style>\n\n'
    '<form action="https://evil.example/"><input name="q"><button>Go</button></form>\n\n'
    '<video src="https://evil.example/v.mp4"></video><audio src="https://evil.example/a.mp3"></audio>\n\n'
    '<p style="position:fixed;inset:0" class="toast">overlay</p>\n\n'
    '<svg onload="window.pwned = 3"><circle r="5"/></svg>\n\n'
    "[js](javascript:window.pwned=4) [data](data:text/html,hi) [mail](mailto:a@example.com) "
    "[web](https://example.com/page)\n\n"
    "![tracker](https://evil.example/pixel.png)\n\n"
    '<img src="https://evil.example/raw.png" alt="raw">\n\n'
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n> quote\n\n1. one\n2. two\n"
)


def test_a_hostile_answer_is_rendered_as_plain_markdown(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    remote: list[str] = []
    page.on("request", lambda request: "evil.example" in request.url and remote.append(request.url))
    sign_up(page, url, "hostile")
    conversation_id, _ = make_conversation(
        "hostile",
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": HOSTILE, "status": "complete"}],
    )
    page.goto(f"{url}/c/{conversation_id}/")
    reply = page.locator("article.msg-assistant .markdown")
    expect(reply.get_by_role("heading", name="Title")).to_be_visible()
    expect(reply.locator("table td").first).to_have_text("1")
    expect(reply.locator("blockquote")).to_have_text("quote")
    expect(reply.locator("ol li")).to_have_count(2)
    banned = (
        "script, img, iframe, style, form, input, button, video, audio, svg, [style], [onerror], [onload]"
    )
    assert reply.locator(banned).count() == 0
    assert reply.locator("[class]").evaluate_all("els => els.map(e => e.className)") == []
    links = reply.locator("a").evaluate_all(
        "els => els.map(a => [a.textContent, a.getAttribute('href'), a.getAttribute('rel')])"
    )
    hrefs = {text: href for text, href, _ in links}
    assert hrefs["mail"] == "mailto:a@example.com" and hrefs["web"] == "https://example.com/page"
    assert hrefs.get("js") is None and hrefs.get("data") is None
    assert all(rel == "noopener noreferrer" for _, href, rel in links if href)
    # Remote images become links to them and are never fetched.
    assert hrefs["Image: tracker"] == "https://evil.example/pixel.png"
    assert hrefs["Image: raw"] == "https://evil.example/raw.png"
    page.wait_for_timeout(300)
    assert remote == []
    assert page.evaluate("window.pwned") is None
    # DOMPurify parses in an inert document that inherits the page's CSP, so Chromium reports
    # the hostile handlers and styles as refused before DOMPurify drops them; nothing else may fail.
    assert [e for e in problems.errors if "Content Security Policy" not in e] == []
    context.close()


def test_streaming_reparses_only_the_last_block(live_site, browser):
    """A long streaming answer keeps its finished blocks' DOM nodes; only the tail is re-parsed."""
    url = live_site.url
    context = browser.new_context()
    page = context.new_page()
    sign_up(page, url, "stream")
    page.goto(f"{url}/")
    result = page.evaluate(
        """async () => {
            const { renderMarkdown, stableLength } = await import('/static/js/chat/markdown.js');
            const target = document.createElement('div');
            let text = '';
            for (let i = 0; i < 200; i++) text += `Paragraph ${i} with *emphasis*.\\n\\n`;
            text += '```js\\nlet a = 1;\\n\\nlet b = 2;\\n';
            renderMarkdown(target, text, true);
            const first = target.querySelector('p');
            const sanitize = window.DOMPurify.sanitize;
            const sizes = [];
            window.DOMPurify.sanitize = (html, cfg) => { sizes.push(html.length); return sanitize(html, cfg); };
            renderMarkdown(target, text + 'let c = 3;\\n', true);
            window.DOMPurify.sanitize = sanitize;
            return { kept: target.querySelector('p') === first, sizes, total: text.length,
                     cutInsideFence: stableLength(text) <= text.indexOf('```') };
        }"""
    )
    assert result["kept"] and result["cutInsideFence"]
    assert len(result["sizes"]) == 1 and result["sizes"][0] < 200 < result["total"], result
    context.close()


# --- The websocket contracts, with the server's socket routed through the test ---------------


def test_client_side_of_the_websocket_contracts(live_site, browser):
    from playwright.sync_api import expect

    url = live_site.url
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    enforce_csp(context)
    page = context.new_page()
    problems = Problems(page)
    sign_up(page, url, "contracts")
    saved = {"role": "assistant", "content": "Because.", "status": "complete"}
    saved.update(reasoning="Saved thoughts.", reasoning_seconds=2.2)
    conversation_id, (question_id, answer_id) = make_conversation(
        "contracts", [{"role": "user", "content": "Why?"}, saved]
    )
    fork_target, _ = make_conversation("contracts", [], title="Forked copy")
    page.clock.install()
    socket = RoutedSocket(page)
    page.goto(f"{url}/c/{conversation_id}/")
    answer = page.locator("article.msg-assistant")
    expect(answer.locator(".msg-content")).to_have_text("Because.")
    expect(answer.locator("details.reasoning summary")).to_have_text("Thought for 2 seconds")
    expect(answer.locator("details.reasoning")).not_to_have_attribute("open", "")
    base = {"conversation_id": conversation_id}
    conversation = {
        "id": conversation_id,
        "title": "Saved",
        "updated_at": None,
        "system_prompt": "",
        "temperature": 0.7,
        "top_p": 1,
        "top_k": 0,
        "max_tokens": 64,
    }
    question = {
        "id": question_id,
        "role": "user",
        "content": "Why?",
        "status": "complete",
        "siblings": [question_id],
    }
    question["sibling_index"] = 0
    live = {"id": answer_id, "role": "assistant", "content": "", "status": "streaming", "reasoning": ""}
    live.update(reasoning_seconds=None, siblings=[answer_id], sibling_index=0)

    # Reasoning (the reasoning contract): open and live while it streams, folded when the answer starts,
    # "Thought for N seconds" when finished.
    socket.inject(type="thread", conversation=conversation, messages=[question, live])
    socket.inject(type="delta", message_id=answer_id, text="", reasoning="Let me think", **base)
    reasoning = answer.locator("details.reasoning")
    expect(reasoning).to_have_attribute("open", "")
    expect(reasoning.locator("summary")).to_have_text("Thinking…")
    expect(reasoning.locator(".reasoning-body")).to_have_text("Let me think")
    socket.inject(type="delta", message_id=answer_id, text="**Yes**", reasoning=" hard.", **base)
    expect(answer.locator(".msg-content strong")).to_have_text("Yes")
    expect(reasoning).not_to_have_attribute("open", "")
    expect(answer.get_by_role("status", name="Answer generating")).to_be_visible()
    assert_no_axe_violations(page, "an answer streaming after its reasoning")

    # The watchdog contract: heartbeats keep it quiet; 15 s of silence re-reads the thread.
    opens = len(socket.sent_of("open"))
    threads = sum(1 for e in socket.received if e["type"] == "thread")
    for _ in range(4):
        page.clock.run_for(5000)
        socket.inject(type="heartbeat", message_id=answer_id, **base)
    page.wait_for_timeout(100)
    assert len(socket.sent_of("open")) == opens
    page.clock.run_for(16_000)
    wait_until(page, lambda: len(socket.sent_of("open")) > opens)
    # The server answers the re-read with the saved thread; the finished event comes after it.
    wait_until(page, lambda: sum(1 for e in socket.received if e["type"] == "thread") > threads)
    expect(answer.locator(".msg-content")).to_have_text("Because.")
    assert socket.sent_of("open")[-1] == {"type": "open", "conversation_id": conversation_id}

    finished = {**live, "content": "**Yes**", "status": "complete", "reasoning": "Let me think hard."}
    finished.update(reasoning_seconds=3.4, completion_tokens=2)
    socket.inject(type="finished", message=finished, **base)
    expect(reasoning.locator("summary")).to_have_text("Thought for 3 seconds")
    expect(answer.locator("details.reasoning")).not_to_have_attribute("open", "")
    expect(page.locator("#announcer")).to_have_text("Answer: Yes")

    # Errors are shown and destroy nothing (the errors contract): the thread stays, the draft comes back.
    prompt = page.get_by_role("textbox", name="Message")
    socket.held.add("send")
    prompt.fill("Tell me more")
    prompt.press("Enter")
    wait_until(page, lambda: socket.sent_of("send"))
    assert prompt.input_value() == ""
    socket.inject(type="error", detail="An answer is still being written here.", code="busy")
    toast = page.get_by_role("alert")
    expect(toast).to_have_text("An answer is still being written here.")
    expect(toast).to_have_attribute("data-code", "busy")
    expect(prompt).to_have_value("Tell me more")
    expect(page.get_by_role("button", name="Send")).to_be_visible()
    expect(answer.locator(".msg-content")).to_have_text("Yes")
    prompt.fill("")
    socket.held.add("edit")
    prompt.press("ArrowUp")
    editor = page.get_by_role("textbox", name="Edit message")
    editor.fill("Why not?")
    editor.press("Enter")
    wait_until(page, lambda: socket.sent_of("edit"))
    expect(editor).to_have_count(0)
    socket.inject(type="error", detail="Stop the answer first.", code="busy")
    expect(editor).to_have_value("Why not?")
    expect(editor).to_be_focused()
    editor.press("Escape")
    expect(page.locator("article.msg-user .msg-text")).to_have_text("Why?")

    # The titles and fork contracts.
    socket.inject(type="title", conversation_id=conversation_id, title="A better title")
    expect(page.get_by_role("heading", name="A better title")).to_be_visible()
    # Hold the real fork: the server now forks for real, and only the injected reply must count.
    socket.held.add("fork")
    answer.get_by_role("button", name="Continue in a new conversation").click()
    wait_until(page, lambda: socket.sent_of("fork"))
    assert socket.sent_of("fork")[-1] == {
        "type": "fork",
        "conversation_id": conversation_id,
        "message_id": answer_id,
    }
    socket.inject(type="forked", conversation_id=fork_target)
    page.wait_for_url(f"{url}/c/{fork_target}/")
    expect(page.get_by_role("heading", name="Forked copy")).to_be_visible()
    assert socket.sent_of("open")[-1] == {"type": "open", "conversation_id": fork_target}
    assert [e for e in problems.errors if "unknown request" not in e] == []
    context.close()
