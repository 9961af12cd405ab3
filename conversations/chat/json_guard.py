"""The sign-in guard of the chat's JSON views."""

from __future__ import annotations

from functools import wraps

from django.http import HttpRequest, JsonResponse


def login_required_json(view):
    """A JSON view: 401 for a visitor who is not signed in, never a redirect."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "sign in first"}, status=401)
        return view(request, *args, **kwargs)

    return wrapper
