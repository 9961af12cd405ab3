"""Sign-up and sign-in pages (the rest of the account pages are Django's own)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from conversations.accounts.forms import SignUpForm


class LoginView(auth_views.LoginView):
    """Django's login page; it links to signup only while signup is open."""

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "allow_signup": settings.ALLOW_SIGNUP}


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.ALLOW_SIGNUP:
        raise Http404("Signup is closed on this site.")
    if request.user.is_authenticated:
        return redirect("home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user)
        return redirect("home")
    return render(request, "registration/signup.html", {"form": form})
