"""Security headers on HTML pages, and secure cookies/HSTS behind SECURE_COOKIES."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def directives(response) -> dict[str, str]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part.strip() for part in policy.split(";") if part.strip()}


@pytest.mark.smoke
@pytest.mark.parametrize("path", ["/accounts/login/", "/", "/settings/api-keys/", "/admin/", "/v1/docs"])
def test_every_html_page_has_a_strict_content_security_policy(client, make_user, path):
    user = make_user("staff")
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    response = client.get(path, follow=True)
    assert response["Content-Type"].startswith("text/html")
    policy = directives(response)
    assert policy["script-src"] == "script-src 'self'"
    assert policy["img-src"] == "img-src 'self' data:"
    assert policy["frame-ancestors"] == "frame-ancestors 'none'"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


def test_templates_have_no_inline_scripts_or_event_handlers():
    import re

    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, f"{template}: inline script {tag}"
        assert not re.search(r"\son[a-z]+\s*=", text), f"{template}: inline event handler"


def test_secure_cookies_turn_on_secure_cookies_hsts_and_the_proxy_header():
    env = {**os.environ, "SECURE_COOKIES": "true", "PYTHONPATH": str(ROOT)}
    env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings"
    code = (
        "from django.conf import settings as s;"
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS > 0,"
        " s.SECURE_PROXY_SSL_HEADER)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "('HTTP_X_FORWARDED_PROTO',", "'https')"]
