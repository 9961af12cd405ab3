"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> HttpResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def too_large(limit: int, size: int | None = None) -> ApiError:
    got = f" ({size} bytes)" if size is not None else ""
    return ApiError(
        413, f"Request body too large{got}: the limit is {limit} bytes.", code="request_too_large"
    )


def internal_error() -> ApiError:
    return ApiError(
        500,
        "The server had an error while processing your request. Sorry about that!",
        type="server_error",
        code="internal_error",
    )


def overloaded() -> ApiError:
    return ApiError(
        429,
        "The engine's waiting queue is full. Please retry after a short wait.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


# Pydantic puts union members' names in error locations ("str", "list[str]", ...).
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|dict|list|function-\w+|constrained-\w+)$|[\[\-]")


def param_of(loc: Any) -> str | None:
    """OpenAI's ``param`` for a Pydantic error location: ``messages[0].role``."""
    parts = list(loc)
    # ninja prefixes the source ("body") and the view argument's name ("body").
    while parts and parts[0] == "body":
        parts.pop(0)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not _TYPE_TAG.search(part):
            out += f".{part}" if out else part
    return out or None


def from_validation_errors(errors: list[dict[str, Any]]) -> ApiError:
    details: dict[str | None, str] = {}
    for error in errors:
        param = param_of(error.get("loc", ()))
        details.setdefault(param, str(error.get("msg", "invalid value")))
    # A union (``str | list[str]``) reports every alternative; the deepest error is the
    # one for the alternative the client meant ("stop[0]", not "stop: not a string").
    deeper = {p for p in details if p}
    for param in list(details):
        if param and any(
            other != param and other.startswith(param) and other[len(param)] in "[." for other in deeper
        ):
            del details[param]
    if not details:
        return invalid("Invalid request body.")
    first = next(iter(details))
    messages = [f"Invalid value for '{p}': {m}" if p else m for p, m in details.items()]
    return invalid("; ".join(messages), param=first)


def error_from_exception(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_errors(exc.errors)
    if isinstance(exc, RequestDataTooBig):
        from django.conf import settings

        return too_large(settings.API_MAX_BODY_BYTES)
    if isinstance(exc, AuthenticationError):
        return ApiError(401, "Missing or invalid API key.", code="invalid_api_key")
    if isinstance(exc, HttpError):
        # ninja wraps parser errors ("Cannot parse request body"); ours ride along as the cause.
        if isinstance(exc.__cause__, ApiError):
            return exc.__cause__
        if exc.status_code == 400:
            return invalid("We could not parse the JSON body of your request.", code="invalid_json")
        return ApiError(exc.status_code, str(exc))
    if isinstance(exc, Http404):
        return ApiError(404, "Not found.", code="not_found")
    return internal_error()


def api_not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """The view for unknown paths under /v1: OpenAI's error shape there too."""
    return ApiError(
        404, f"Unknown request URL: {request.method} {request.path}.", code="unknown_url"
    ).response()


def install_handlers(api: NinjaAPI, on_error) -> None:
    """Every exception becomes an OpenAI-shaped response; ``on_error(request, error)``
    records it. Unexpected exceptions are logged here and answered with a bare 500."""

    def handle(request: HttpRequest, exc: Exception) -> HttpResponse:
        error = error_from_exception(exc)
        if error.status >= 500 and not isinstance(exc, ApiError):
            log.error("API error on %s", request.path, exc_info=exc)
        on_error(request, error, exc)
        return error.response()

    for cls in (Exception, ApiError, ValidationError, HttpError, AuthenticationError, Http404):
        api.add_exception_handler(cls, handle)
