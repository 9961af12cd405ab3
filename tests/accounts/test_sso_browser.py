"""Single sign-on end to end in Debian's Chromium: a real OpenID Connect provider
(django-oauth-toolkit, ``tests/support/oidc_provider``) runs as its own process; the browser
clicks "Sign in with Example IdP", logs in at the provider and comes back signed in, with its
groups taken from the claim. Deactivated at the provider, the user is signed out here at the
next refresh."""

from __future__ import annotations

import time

import pytest

from tests.chat.browser_pages import assert_no_axe_violations
from tests.chat.test_browser import browser, in_thread  # noqa: F401  (fixture)
from tests.live_site import free_port, start_live_site, stop_live_site
from tests.support.oidc_provider.process import CLIENT_ID, CLIENT_SECRET, start_provider, stop_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PROVIDER_PASSWORD = "ada-at-the-provider-1"
REFRESH_SECONDS = 4


@pytest.fixture(scope="module")
def sso_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sso")
    provider_port = free_port()
    issuer = f"http://127.0.0.1:{provider_port}/o"
    site = start_live_site(
        tiny_model_dir,
        workdir,
        OIDC_ISSUER=issuer,
        OIDC_CLIENT_ID=CLIENT_ID,
        OIDC_CLIENT_SECRET=CLIENT_SECRET,
        OIDC_PROVIDER_NAME="Example IdP",
        OIDC_REFRESH_SECONDS=str(REFRESH_SECONDS),
    )
    users = [
        {
            "username": "ada",
            "password": PROVIDER_PASSWORD,
            "email": "ada@example.org",
            "groups": ["research", "api-users"],
        }
    ]
    try:
        provider = start_provider(provider_port, workdir, f"{site.url}/accounts/sso/callback/", users)
    except Exception:
        stop_live_site(site)
        raise
    yield site, provider
    stop_provider(provider)
    stop_live_site(site)


def site_user(username: str) -> dict | None:
    def read():
        from django.contrib.auth import get_user_model

        from conversations.models import AuditEvent

        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            return None
        return {
            "email": user.email,
            "groups": sorted(user.groups.values_list("name", flat=True)),
            "identities": list(user.identities.values_list("subject", flat=True)),
            "audit": list(AuditEvent.objects.filter(actor_id=user.pk).values_list("action", "detail")),
        }

    return in_thread(read)


def test_sign_in_with_the_provider_and_lose_access_when_deactivated_there(sso_site, browser):  # noqa: F811
    from playwright.sync_api import expect

    site, provider = sso_site
    page = browser.new_context().new_page()
    page.goto(f"{site.url}/accounts/login/")
    assert_no_axe_violations(page, "sign-in page with single sign-on")
    page.get_by_role("link", name="Sign in with Example IdP").click()

    page.wait_for_url(f"{provider.url}/accounts/login/**")
    expect(page.get_by_role("heading", name="Example IdP")).to_be_visible()
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill(PROVIDER_PASSWORD)
    page.get_by_role("button", name="Log in to Example IdP").click()

    page.wait_for_url(f"{site.url}/")
    expect(page.get_by_role("button", name="New chat").first).to_be_visible()
    ada = site_user("ada")
    assert ada is not None, provider.log()
    assert ada["email"] == "ada@example.org"
    assert ada["groups"] == ["api-users", "research"]  # from the provider's groups claim
    assert len(ada["identities"]) == 1
    assert ("auth.sign_in", {"backend": "conversations.accounts.sso.backend.SsoBackend"}) in ada["audit"]

    # Deactivated at the provider: the next refresh is refused and the session here ends.
    provider.set_active("ada", False)
    time.sleep(REFRESH_SECONDS + 0.5)
    page.goto(f"{site.url}/")
    page.wait_for_url(f"{site.url}/accounts/sso/ended/")
    expect(page.get_by_role("heading", name="You were signed out")).to_be_visible()
    assert_no_axe_violations(page, "signed-out page")
    page.goto(f"{site.url}/")
    assert "/accounts/login/" in page.url
    audit = site_user("ada")["audit"]
    assert ("auth.sign_out", {"reason": "refused by the identity provider"}) in audit
