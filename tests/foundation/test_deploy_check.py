"""``manage.py check --deploy`` on production settings, and the HTTPS redirect they turn on."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def production_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """What a deployment sets: no debug, its own key and hosts, HTTPS behind a proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "HSTS_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings",
        PYTHONPATH=str(ROOT),
        VAR_DIR=str(var_dir),
        DEBUG="false",
        REQUIRE_SECRET_KEY="true",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="chat.example.com",
        SECURE_COOKIES="true",
        SECURE_SSL_REDIRECT="true",
        **extra,
    )
    return env


def deploy_check(env: dict[str, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, set(re.findall(r"\(([a-z_]+\.[A-Z]\d{3})\)", result.stdout + result.stderr))


def test_check_deploy_on_production_settings_reports_only_the_hsts_opt_ins(tmp_path):
    result, issues = deploy_check(production_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert issues == {"security.W005", "security.W021"}, result.stdout + result.stderr


def test_check_deploy_is_clean_once_the_hsts_opt_ins_are_taken(tmp_path):
    env = production_env(tmp_path, HSTS_INCLUDE_SUBDOMAINS="true", HSTS_PRELOAD="true")
    result, issues = deploy_check(env)
    assert result.returncode == 0, result.stderr
    assert issues == set(), result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_ssl_redirect_is_off_unless_the_environment_turns_it_on(tmp_path):
    code = "from django.conf import settings; print(settings.SECURE_SSL_REDIRECT)"
    local = {k: v for k, v in os.environ.items() if k != "SECURE_SSL_REDIRECT"}
    local.update(DJANGO_SETTINGS_MODULE="chatsite.settings", PYTHONPATH=str(ROOT))
    for env, shown in ((local, "False"), (production_env(tmp_path), "True")):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == shown


@pytest.mark.django_db(transaction=True)
def test_ssl_redirect_sends_pages_to_https_but_answers_probes_and_scrapes_in_place(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    response = client.get("/accounts/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/accounts/login/"
    assert client.get("/livez").status_code == 200
    assert client.get("/healthz").status_code in {200, 503}
    assert client.get("/metrics").status_code == 401  # asks for credentials, not for HTTPS
    # Behind the proxy, its X-Forwarded-Proto marks the request secure: no redirect.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"}).status_code == 200
