"""Account pages, under /accounts/: sign-up, a throttled sign-in, and Django's others."""

from django.urls import include, path

from conversations.accounts import views
from conversations.accounts.login_throttle import throttled

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    # Before Django's own pages, whose login view this one replaces.
    path("login/", throttled(views.LoginView.as_view()), name="login"),
    path("", include("django.contrib.auth.urls")),
]
