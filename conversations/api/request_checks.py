"""The API's checks of a request before anything is queued, and its identity in the engine.

A request's fan-out, its stream options and the key owner's model access are checked here (a 4xx
from each), the owner's token quotas admitted, and the engine options that tie the request to
its API key (fair share, prefix-cache namespace) built.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest

from conversations.accounts import quota
from conversations.api.errors import ApiError, invalid
from conversations.chat.cache_salt import cache_options


def check_fan_out(n: int | None, num_prompts: int) -> None:
    """One request may not ask for more completions than API_MAX_SEQUENCES_PER_REQUEST
    (n x prompts): a 400 before anything is queued."""
    total = (n or 1) * num_prompts
    limit = settings.API_MAX_SEQUENCES_PER_REQUEST
    if total > limit:
        raise invalid(
            f"This request asks for {total} completions (n={n or 1} x {num_prompts} prompts); "
            f"this server allows at most {limit} per request.",
            param="n",
            code="too_many_sequences",
        )


def engine_owner(request: HttpRequest) -> str:
    """Fair share in the engine is per API key: a flooding key queues behind itself."""
    return f"api-key:{request.auth.pk}"


async def admit_tokens(request: HttpRequest, prompt_tokens: int) -> quota.Admission:
    """The key owner's token quotas checked and the prompt counted, atomically across
    processes; a spent budget is a 429 saying what ran out, with ``Retry-After`` until it resets."""
    try:
        return await sync_to_async(quota.admission)(request.auth.owner_id, prompt_tokens)
    except quota.Exhausted as exc:
        raise ApiError(
            429,
            str(exc),
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"Retry-After": str(exc.retry_after)},
        ) from exc


def engine_cache(
    request: HttpRequest, cache_salt: str | None, shared_prefix_tokens: int = 0
) -> dict[str, Any]:
    """The prefix cache is the key owner's (shared with their chat); a body's ``cache_salt``
    is nested inside it, never used as it came."""
    return cache_options(request.auth.owner_id, shared_prefix_tokens, cache_salt)


def count_prompts(prompt: Any) -> int:
    """A string or token-id list is one prompt; a list of them is several."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


def check_stream_options(body: Any) -> None:
    """``stream_options`` belongs to streamed responses (OpenAI and vLLM answer 400)."""
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options is only allowed when stream is true.", param="stream_options")


def check_model_access(request: HttpRequest, model_id: str) -> None:
    """A 403 when the key owner's groups exclude ``model_id``."""
    if not request.auth.access.may_use_model(model_id):
        raise ApiError(
            403,
            f"Your groups do not give you access to the model `{model_id}`.",
            type="permission_error",
            param="model",
            code="model_access_denied",
        )
