"""The provider's endpoints, read from ``{OIDC_ISSUER}/.well-known/openid-configuration``.

Read on first use and kept in the process for ``DISCOVERY_TTL`` seconds; never at import or
start-up, so a provider that is down stops sign-ins (with a page that says so), not the site.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests
from django.conf import settings

DISCOVERY_TTL = 3600.0
TIMEOUT_SECONDS = 10.0


class ProviderUnavailable(Exception):
    """The identity provider could not be reached or answered nonsense."""


@dataclass(frozen=True)
class ProviderEndpoints:
    issuer: str
    authorization: str
    token: str
    userinfo: str
    jwks: str
    end_session: str


_lock = threading.Lock()
_cached: tuple[str, float, ProviderEndpoints] | None = None


def configuration_url(issuer: str) -> str:
    return f"{issuer.rstrip('/')}/.well-known/openid-configuration"


def endpoints() -> ProviderEndpoints:
    global _cached
    issuer = settings.OIDC_ISSUER
    if not issuer:
        raise ProviderUnavailable("single sign-on is not configured (OIDC_ISSUER is empty)")
    with _lock:
        if _cached and _cached[0] == issuer and time.monotonic() - _cached[1] < DISCOVERY_TTL:
            return _cached[2]
    found = _discover(issuer)
    with _lock:
        _cached = (issuer, time.monotonic(), found)
    return found


def forget() -> None:
    """Read the configuration again at the next use (tests, a changed provider)."""
    global _cached
    with _lock:
        _cached = None


def _discover(issuer: str) -> ProviderEndpoints:
    try:
        response = requests.get(configuration_url(issuer), timeout=TIMEOUT_SECONDS)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"the identity provider's configuration could not be read: {exc}") from exc
    try:
        found = ProviderEndpoints(
            issuer=document["issuer"],
            authorization=document["authorization_endpoint"],
            token=document["token_endpoint"],
            userinfo=document.get("userinfo_endpoint", ""),
            jwks=document["jwks_uri"],
            end_session=document.get("end_session_endpoint", ""),
        )
    except (KeyError, TypeError) as exc:
        raise ProviderUnavailable(f"the identity provider's configuration lacks {exc}") from exc
    if found.issuer.rstrip("/") != issuer.rstrip("/"):
        raise ProviderUnavailable(f"the provider names itself {found.issuer!r}, not {issuer!r}")
    return found
