"""Keeping an SSO session in step with the provider.

Every ``OIDC_REFRESH_SECONDS`` a signed-in SSO user's next page request exchanges the refresh
token at the provider's token endpoint. A refusal (the account deactivated there, the session
revoked) signs the user out here, with a page that says why; a success re-applies the claims
(name, e-mail, groups). A provider that cannot be reached is asked again a minute later: its
outage does not sign everyone out. Open websockets keep their user until they reconnect.
"""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import auth
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from conversations.accounts.sso import discovery
from conversations.accounts.sso.backend import SsoBackend, apply_claims, remember_tokens

log = logging.getLogger(__name__)
RETRY_SECONDS = 60.0
BACKEND_PATH = "conversations.accounts.sso.backend.SsoBackend"


class Refused(Exception):
    """The provider no longer accepts the session."""


def refresh(request: HttpRequest) -> None:
    """Raises ``Refused``; a provider that cannot be reached raises ``ProviderUnavailable``."""
    session = request.session
    endpoints = discovery.endpoints()
    token = session.get("sso_refresh_token", "")
    if not token:
        raise Refused("the provider gave no refresh token")
    try:
        answer = requests.post(
            endpoints.token,
            data={
                "grant_type": "refresh_token",
                "refresh_token": token,
                "client_id": settings.OIDC_RP_CLIENT_ID,
                "client_secret": settings.OIDC_RP_CLIENT_SECRET,
            },
            timeout=discovery.TIMEOUT_SECONDS,
        )
    except requests.RequestException as exc:
        raise discovery.ProviderUnavailable(str(exc)) from exc
    if answer.status_code in (400, 401, 403):
        raise Refused(answer.text[:200])
    if answer.status_code != 200:
        raise discovery.ProviderUnavailable(f"token endpoint answered {answer.status_code}")
    tokens = answer.json()
    backend = SsoBackend()
    backend.request = request
    claims: dict = {}
    if tokens.get("id_token"):
        try:
            claims = backend.verify_token(tokens["id_token"], nonce=None)
        except SuspiciousOperation as exc:
            raise Refused(str(exc)) from exc
    if endpoints.userinfo:
        try:
            claims.update(backend.get_userinfo(tokens["access_token"], tokens.get("id_token"), claims))
        except requests.HTTPError as exc:
            raise Refused(str(exc)) from exc
    if claims.get("sub") and claims["sub"] != session.get("sso_subject", claims["sub"]):
        raise Refused("the provider answered for another account")
    apply_claims(request.user, claims)
    remember_tokens(session, tokens["access_token"], tokens.get("refresh_token") or token)


class SsoRefreshMiddleware:
    """After ``AuthenticationMiddleware``: refreshes SSO sessions that are due."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        due = request.session.get("sso_refresh_at") if hasattr(request, "session") else None
        if due is not None and timezone.now().timestamp() >= due and request.user.is_authenticated:
            try:
                refresh(request)
            except discovery.ProviderUnavailable as exc:
                log.warning("single sign-on refresh for %s: provider unavailable: %s", request.user, exc)
                request.session["sso_refresh_at"] = timezone.now().timestamp() + RETRY_SECONDS
            except Refused as exc:
                log.info(
                    "single sign-on: %s signed out, the provider refused the refresh: %s", request.user, exc
                )
                request.audit_sign_out_reason = "refused by the identity provider"
                auth.logout(request)
                return redirect("sso-ended")
        return self.get_response(request)
