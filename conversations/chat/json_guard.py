"""What the JSON views share: the sign-in guard and reading the body."""

from __future__ import annotations

import json
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


def json_body(request: HttpRequest) -> dict:
    """The request's JSON object; anything else (no body, bad JSON, a list) is ``{}``."""
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
