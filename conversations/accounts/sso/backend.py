"""The authentication backend for the provider's users: mozilla-django-oidc's code flow, with
the endpoints from discovery, the ID token's issuer and audience checked, users found by
(issuer, subject), and their name, e-mail and groups taken from the claims at every sign-in
and refresh.

Groups: with ``OIDC_GROUPS_CLAIM`` set, the user's groups become exactly the groups that the
claim names (created when new); an admin sets groups only for local accounts.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from conversations.accounts.sso import discovery
from conversations.models import ExternalIdentity

log = logging.getLogger(__name__)
USERNAME_LENGTH = 150
GROUP_NAME_LENGTH = 150


class SsoBackend(OIDCAuthenticationBackend):
    """Built for every request of a signed-in SSO user (Django loads the session's backend),
    so construction reads settings only; the provider is asked when a flow needs it."""

    def __init__(self, *args, **kwargs) -> None:
        ModelBackend.__init__(self)
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.token_info: dict[str, Any] = {}
        self.subject = ""

    # The endpoints the library's methods read, from discovery.
    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # noqa: N802 - the library's attribute name
        return discovery.endpoints().token

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:  # noqa: N802
        return discovery.endpoints().userinfo

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:  # noqa: N802
        return discovery.endpoints().jwks

    def get_user(self, user_id):
        """As Django's ``ModelBackend``: a deactivated user's session ends."""
        return ModelBackend.get_user(self, user_id)

    def get_token(self, payload):
        self.token_info = super().get_token(payload)
        return self.token_info

    def verify_token(self, token, **kwargs):
        """The library checks the signature, expiry and nonce; the issuer and audience too."""
        payload = super().verify_token(token, **kwargs)
        check_issuer_and_audience(payload)
        self.subject = str(payload.get("sub", ""))
        return payload

    def store_tokens(self, access_token, id_token) -> None:
        session = self.request.session
        session["sso_subject"] = self.subject
        remember_tokens(session, access_token, self.token_info.get("refresh_token", ""))

    def get_userinfo(self, access_token, id_token, payload):
        """The userinfo endpoint's claims over the ID token's (a provider may put groups in either)."""
        claims = dict(payload)
        if discovery.endpoints().userinfo:
            claims.update(super().get_userinfo(access_token, id_token, payload))
        return claims

    def verify_claims(self, claims) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            identities__issuer=settings.OIDC_ISSUER, identities__subject=str(claims["sub"])
        )

    def describe_user_by_claims(self, claims) -> str:
        return f"subject {claims.get('sub')}"

    @transaction.atomic
    def create_user(self, claims):
        user = self.UserModel.objects.create_user(free_username(claims), email=claim(claims, "email"))
        ExternalIdentity.objects.create(user=user, issuer=settings.OIDC_ISSUER, subject=str(claims["sub"]))
        return self.update_user(user, claims)

    @transaction.atomic
    def update_user(self, user, claims):
        return apply_claims(user, claims)


def check_issuer_and_audience(payload: dict) -> None:
    issuer = discovery.endpoints().issuer
    if str(payload.get("iss", "")).rstrip("/") != issuer.rstrip("/"):
        raise SuspiciousOperation(f"the ID token was issued by {payload.get('iss')!r}, not {issuer!r}")
    audience = payload.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if settings.OIDC_RP_CLIENT_ID not in audiences:
        raise SuspiciousOperation("the ID token is not meant for this site (audience)")


def remember_tokens(session, access_token: str, refresh_token: str) -> None:
    """What the refresh needs, and when it is due (``conversations.accounts.sso.refresh``)."""
    session["sso_access_token"] = access_token
    session["sso_refresh_token"] = refresh_token or ""
    session["sso_refresh_at"] = timezone.now().timestamp() + settings.OIDC_REFRESH_SECONDS


def claim(claims: dict, name: str) -> str:
    """The claim that ``OIDC_<NAME>_CLAIM`` names, as text ("" when absent or unset)."""
    key = getattr(settings, f"OIDC_{name.upper()}_CLAIM", "")
    value = claims.get(key) if key else None
    return str(value) if value is not None else ""


def free_username(claims: dict) -> str:
    """The username claim (or the subject), made unique beside existing accounts: a local
    account of the same name is never taken over."""
    base = (claim(claims, "username") or str(claims["sub"]))[: USERNAME_LENGTH - 8]
    users = get_user_model().objects
    name, n = base, 1
    while users.filter(username=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def claimed_groups(claims: dict) -> list[str] | None:
    """The group names the claim carries; None when groups are not taken from the provider."""
    key = settings.OIDC_GROUPS_CLAIM
    if not key:
        return None
    value = claims.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        log.warning("the %r claim is not a list of group names: %r", key, value)
        return []
    return sorted({str(name).strip()[:GROUP_NAME_LENGTH] for name in value if str(name).strip()})


def apply_claims(user, claims: dict):
    fields = {
        "email": claim(claims, "email"),
        "first_name": claim(claims, "first_name")[:150],
        "last_name": claim(claims, "last_name")[:150],
    }
    changed = [name for name, value in fields.items() if value and getattr(user, name) != value]
    for name in changed:
        setattr(user, name, fields[name])
    if changed:
        user.save(update_fields=changed)
    names = claimed_groups(claims)
    if names is not None:
        groups = [Group.objects.get_or_create(name=name)[0] for name in names]
        current = set(user.groups.values_list("pk", flat=True))
        wanted = {g.pk for g in groups}
        if current - wanted:
            user.groups.remove(*(current - wanted))
        if wanted - current:
            user.groups.add(*(wanted - current))
    ExternalIdentity.objects.filter(user=user, issuer=settings.OIDC_ISSUER).update(
        last_sign_in_at=timezone.now()
    )
    return user
