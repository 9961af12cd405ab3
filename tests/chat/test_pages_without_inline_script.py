"""The site's pages run under a CSP that allows scripts from 'self' only (the no-inline-script
contract in docs/interfaces.md): no inline script, no inline event handler, no style attribute,
scripts and images from the site itself."""

from __future__ import annotations

import re

import pytest
from django.test import Client

INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
INLINE_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)
STYLE_ATTR = re.compile(r"<[^>]+\sstyle\s*=", re.I)
REMOTE = re.compile(r"<(?:script|img)\b[^>]*\bsrc=\"(?:https?:)?//", re.I)


@pytest.mark.django_db
@pytest.mark.smoke
def test_pages_hold_no_inline_script_handler_or_style_attribute(make_user):
    anonymous = Client()
    client = Client()
    user = make_user()
    client.force_login(user)
    share = _hostile_share(user)
    pages = {
        "/accounts/login/": anonymous.get("/accounts/login/"),
        "/accounts/signup/": anonymous.get("/accounts/signup/"),
        "/": client.get("/"),
        "/settings/api-keys/": client.get("/settings/api-keys/"),
        "/settings/presets/": client.get("/settings/presets/"),
        "/shares/": client.get("/shares/"),
        "/s/<token>/": client.get(f"/s/{share.token}/"),
    }
    for path, response in pages.items():
        assert response.status_code == 200, path
        html = response.content.decode()
        for pattern in (INLINE_SCRIPT, INLINE_HANDLER, STYLE_ATTR, REMOTE):
            assert not pattern.search(html), f"{path}: {pattern.search(html).group(0)}"
    assert '<script type="module" src="/static/js/chat/main.js">' in pages["/"].content.decode()


def _hostile_share(user):
    """A share whose messages try every kind of inline markup: the page must escape them all."""
    from conversations.chat import tree as tree_ops
    from conversations.models import Conversation, Message
    from conversations.workspace.sharing import take_snapshot

    conversation = Conversation.objects.create(owner=user, title="<script>x()</script>")
    _, answer = tree_ops.send_message(conversation, '<b style="color:red" onclick="x()">hi</b>')
    Message.objects.filter(pk=answer.pk).update(
        content="<script>x()</script>", status=Message.Status.COMPLETE
    )
    return take_snapshot(conversation)
