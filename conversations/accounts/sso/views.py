"""The sign-in views: mozilla-django-oidc's, with the endpoints from discovery and a page that
says what went wrong (the provider unreachable, an error it returned, a refused account) in
place of an exception or a silent redirect."""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from conversations.accounts.sso import discovery

log = logging.getLogger(__name__)


def problem_page(request: HttpRequest, title: str, detail: str, status: int) -> HttpResponse:
    context = {"title": title, "detail": detail, "provider": settings.OIDC_PROVIDER_NAME}
    return render(request, "registration/sso_problem.html", context, status=status)


def _unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.warning("single sign-on: %s", exc)
    return problem_page(
        request,
        f"{settings.OIDC_PROVIDER_NAME} is not answering",
        "The identity provider could not be reached, so you cannot sign in right now. "
        "Please try again in a few minutes; if it keeps happening, tell your administrator.",
        503,
    )


class SsoStart(OIDCAuthenticationRequestView):
    """Sends the browser to the provider's sign-in page."""

    def __init__(self, *args, **kwargs) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ISSUER:
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery.endpoints().authorization
        except discovery.ProviderUnavailable as exc:
            return _unavailable(request, exc)
        return super().get(request)


class SsoCallback(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: signs the user in, or says why not."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ISSUER:
            raise Http404("single sign-on is not configured")
        error = request.GET.get("error")
        try:
            response = super().get(request)
        except discovery.ProviderUnavailable as exc:
            return _unavailable(request, exc)
        except requests.RequestException as exc:
            log.warning("single sign-on: the provider's answer failed: %s", exc)
            return problem_page(
                request,
                "Sign-in could not be completed",
                f"{settings.OIDC_PROVIDER_NAME} did not accept this site's request to finish the sign-in "
                "(its answer was an error). Please try again; if it keeps happening, tell your administrator.",
                502,
            )
        except SuspiciousOperation as exc:
            log.warning("single sign-on: refused an answer: %s", exc)
            return problem_page(
                request,
                "Sign-in could not be completed",
                "The answer from the identity provider could not be trusted (it was expired, replayed or "
                "meant for another site). Please start the sign-in again.",
                400,
            )
        if error:
            return self._provider_error(request, error)
        return response

    def _provider_error(self, request: HttpRequest, error: str) -> HttpResponse:
        description = request.GET.get("error_description", "")[:500]
        if error == "access_denied":
            detail = f"{settings.OIDC_PROVIDER_NAME} did not let you sign in to this site"
        else:
            detail = f"{settings.OIDC_PROVIDER_NAME} reported an error ({error[:100]})"
        detail += f": {description}" if description else "."
        return problem_page(request, "Sign-in was refused", detail, 403)

    def login_failure(self) -> HttpResponse:
        return problem_page(
            self.request,
            "Sign-in was refused",
            f"{settings.OIDC_PROVIDER_NAME} signed you in, but this site could not: your account here may "
            "be deactivated, or the sign-in took too long. Start again, or ask your administrator.",
            403,
        )


def session_ended(request: HttpRequest) -> HttpResponse:
    return problem_page(
        request,
        "You were signed out",
        f"{settings.OIDC_PROVIDER_NAME} no longer accepts your session (your account there may have been "
        "deactivated, or the session revoked). Sign in again to continue.",
        200,
    )
