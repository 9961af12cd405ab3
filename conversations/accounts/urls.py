"""Account pages, under /accounts/: sign-up, a throttled sign-in, and Django's others."""

from django.urls import include, path

from conversations.accounts import views
from conversations.accounts.login_throttle import throttled
from conversations.accounts.sso import views as sso

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    # Before Django's own pages, whose login view this one replaces.
    path("login/", throttled(views.LoginView.as_view()), name="login"),
    # Single sign-on; the callback's name is the one mozilla-django-oidc reverses for redirect_uri.
    path("sso/start/", sso.SsoStart.as_view(), name="sso-start"),
    path("sso/callback/", sso.SsoCallback.as_view(), name="oidc_authentication_callback"),
    path("sso/ended/", sso.session_ended, name="sso-ended"),
    path("", include("django.contrib.auth.urls")),
]
