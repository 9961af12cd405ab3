"""Single sign-on without a browser: the sign-in page's options, local sign-in and signup
turned off, and the pages for a provider that is down or refuses (never a 500).
The whole flow against a real provider is ``test_sso_browser``."""

from __future__ import annotations

import pytest
from django.test import Client

from conversations.accounts.sso import discovery
from tests.live_site import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def sso(settings):
    settings.OIDC_ISSUER = f"http://127.0.0.1:{free_port()}/o"  # nothing listens there
    settings.OIDC_RP_CLIENT_ID = "site"
    settings.OIDC_RP_CLIENT_SECRET = "secret"
    settings.OIDC_PROVIDER_NAME = "Example IdP"
    discovery.forget()
    yield settings
    discovery.forget()


def test_the_sign_in_page_offers_the_provider_beside_the_password_form(sso):
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Example IdP" in page and 'href="/accounts/sso/start/"' in page
    assert 'name="password"' in page


def test_without_an_issuer_there_is_no_provider_button_and_no_sso_pages(settings):
    settings.OIDC_ISSUER = ""
    assert "Sign in with" not in Client().get("/accounts/login/").content.decode()
    assert Client().get("/accounts/sso/start/").status_code == 404


def test_local_sign_in_and_signup_turned_off(sso, make_user):
    sso.ALLOW_LOCAL_LOGIN = False
    make_user("carol", "a-long-unusual-passphrase-42")
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Example IdP" in page and 'name="password"' not in page and "Sign up" not in page
    refused = client.post(
        "/accounts/login/", {"username": "carol", "password": "a-long-unusual-passphrase-42"}
    )
    assert refused.status_code == 403 and b"turned off" in refused.content
    assert "_auth_user_id" not in client.session
    assert client.get("/accounts/signup/").status_code == 404
    admin_login = client.post(
        "/admin/login/", {"username": "carol", "password": "a-long-unusual-passphrase-42"}
    )
    assert admin_login.status_code == 302 and admin_login["Location"].startswith("/accounts/login/")
    assert "_auth_user_id" not in client.session


def test_signup_alone_turned_off_keeps_password_sign_in(settings):
    settings.ALLOW_SIGNUP = False
    page = Client().get("/accounts/login/").content.decode()
    assert 'name="password"' in page and "Sign up" not in page


def test_a_provider_that_is_down_gives_a_page_that_says_so(sso):
    response = Client().get("/accounts/sso/start/")
    assert response.status_code == 503
    assert b"Example IdP is not answering" in response.content


def test_an_error_from_the_provider_gives_a_page_that_says_what_happened(sso):
    client = Client()
    response = client.get(
        "/accounts/sso/callback/",
        {
            "error": "access_denied",
            "error_description": "You are not assigned to this application",
            "state": "x",
        },
    )
    assert response.status_code == 403
    text = response.content.decode()
    assert "Sign-in was refused" in text and "You are not assigned to this application" in text


def test_a_callback_the_site_did_not_start_is_refused_with_a_page(sso):
    response = Client().get("/accounts/sso/callback/", {"code": "forged", "state": "unknown"})
    assert response.status_code == 403 and b"Sign-in was refused" in response.content
