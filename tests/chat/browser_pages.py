"""Page helpers for the browser UI tests: database set-up off Playwright's event loop, the
site's content security policy enforced on every document, axe-core, and a websocket routed
through the test."""

from __future__ import annotations

import json
import re

from tests.chat.test_browser import in_thread


def make_conversation(username: str, messages: list[dict], **fields) -> tuple[int, list[int]]:
    """A conversation owned by ``username`` holding one path of ``messages``; returns its and their ids."""

    def make():
        from django.contrib.auth import get_user_model

        from conversations.models import Conversation, Message

        owner = get_user_model().objects.get(username=username)
        conversation = Conversation.objects.create(owner=owner, title=fields.pop("title", "Saved"), **fields)
        parent, ids = None, []
        for data in messages:
            parent = Message.objects.create(conversation=conversation, parent=parent, **data)
            ids.append(parent.pk)
        Conversation.objects.filter(pk=conversation.pk).update(current_leaf=parent)
        return conversation.pk, ids

    return in_thread(make)


def update_conversation(conversation_id: int, **fields) -> None:
    def update():
        from conversations.models import Conversation

        Conversation.objects.filter(pk=conversation_id).update(**fields)

    in_thread(update)


def share_conversation(conversation_id: int) -> str:
    """A share link's token for the conversation's visible branch (conversations.workspace)."""

    def share():
        from conversations.models import Conversation
        from conversations.workspace.sharing import take_snapshot

        return take_snapshot(Conversation.objects.get(pk=conversation_id)).token

    return in_thread(share)


# Contract #7, enforced here whatever the server sends, so a UI change that needs an inline script,
# an inline handler, a style attribute or a remote image fails these tests.
CSP = (
    "default-src 'self'; script-src 'self'; img-src 'self' data:; style-src 'self'; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'"
)


def enforce_csp(context) -> None:
    def add_header(route):
        if route.request.resource_type != "document" or route.request.method != "GET":
            route.continue_()
            return
        response = route.fetch(max_redirects=0)
        headers = {**response.headers}
        if headers.get("content-type", "").startswith("text/html"):
            headers["content-security-policy"] = CSP
        route.fulfill(response=response, headers=headers)

    context.route(re.compile(r"^http://127\.0\.0\.1:\d+/(?!static/)"), add_header)


def assert_no_axe_violations(page, name: str) -> None:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    assert results.violations_count == 0, f"{name}:\n{results.generate_report()}"


class RoutedSocket:
    """Passes the chat socket through, recording what the page sends and letting the test inject events."""

    def __init__(self, page):
        self.sent: list[dict] = []
        self.received: list[dict] = []
        self.held: set[str] = set()  # request types recorded but not passed on to the server
        self.route = None
        page.route_web_socket(re.compile(r"/ws/chat/"), self._connect)

    def _connect(self, route) -> None:
        server = route.connect_to_server()
        self.route = route

        def from_page(message):
            data = json.loads(message)
            self.sent.append(data)
            if data.get("type") not in self.held:
                server.send(message)

        route.on_message(from_page)

        def from_server(message):
            self.received.append(json.loads(message))
            route.send(message)

        server.on_message(from_server)

    def inject(self, **event) -> None:
        self.route.send(json.dumps(event))

    def sent_of(self, kind: str) -> list[dict]:
        return [m for m in self.sent if m.get("type") == kind]


def wait_until(page, condition, seconds: float = 10) -> None:
    for _ in range(int(seconds * 10)):
        if condition():
            return
        page.wait_for_timeout(100)
    raise AssertionError("the condition never held")
