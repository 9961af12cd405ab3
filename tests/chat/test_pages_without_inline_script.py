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
    client.force_login(make_user())
    pages = {
        "/accounts/login/": anonymous.get("/accounts/login/"),
        "/accounts/signup/": anonymous.get("/accounts/signup/"),
        "/": client.get("/"),
        "/settings/api-keys/": client.get("/settings/api-keys/"),
    }
    for path, response in pages.items():
        assert response.status_code == 200, path
        html = response.content.decode()
        for pattern in (INLINE_SCRIPT, INLINE_HANDLER, STYLE_ATTR, REMOTE):
            assert not pattern.search(html), f"{path}: {pattern.search(html).group(0)}"
    assert '<script type="module" src="/static/js/chat/main.js">' in pages["/"].content.decode()
