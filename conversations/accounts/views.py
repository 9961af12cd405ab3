"""Sign-up and sign-in pages (the rest of the account pages are Django's own)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from conversations.accounts.forms import SignUpForm
from conversations.accounts.login_throttle import throttled


class LoginView(auth_views.LoginView):
    """Django's login page, with "Sign in with …" when single sign-on is configured; the
    password form only while local sign-in is on, and the signup link only while signup is."""

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **sign_in_options()}

    def post(self, request, *args, **kwargs):
        if not settings.ALLOW_LOCAL_LOGIN:
            return local_login_off(request)
        return super().post(request, *args, **kwargs)


def sign_in_options() -> dict:
    return {
        "allow_signup": signup_open(),
        "allow_local_login": settings.ALLOW_LOCAL_LOGIN,
        "sso_provider": settings.OIDC_PROVIDER_NAME if settings.OIDC_ISSUER else "",
    }


def signup_open() -> bool:
    """Signup makes a local password account: closed when local sign-in is off."""
    return settings.ALLOW_SIGNUP and settings.ALLOW_LOCAL_LOGIN


def local_login_off(request: HttpRequest) -> HttpResponse:
    context = {**sign_in_options(), "form": None, "local_login_refused": True}
    return render(request, "registration/login.html", context, status=403)


def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's password sign-in, or, with local sign-in off, the site's sign-in page
    (staff sign in with single sign-on and come back)."""
    if not settings.ALLOW_LOCAL_LOGIN:
        if request.user.is_authenticated and request.user.is_staff:
            return redirect(request.GET.get("next") or "/admin/")
        return redirect_to_login(request.GET.get("next") or "/admin/")
    return throttled(admin.site.login)(request)


def signup(request: HttpRequest) -> HttpResponse:
    if not signup_open():
        raise Http404("Signup is closed on this site.")
    if request.user.is_authenticated:
        return redirect("home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user)
        return redirect("home")
    return render(request, "registration/signup.html", {"form": form})
