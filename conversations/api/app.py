"""The OpenAI-compatible API, mounted at /v1 (OpenAPI document at /v1/openapi.json, docs at /v1/docs).

Disconnects: Django's ASGIHandler (5.2) listens for ``http.disconnect`` while the view
runs *and* while a streaming response is sent, and cancels the task doing either.
- Non-streaming: the cancellation lands in the view, inside ``Generation.deltas()``,
  whose ``finally`` closes the engine streams and aborts the engine requests.
- Streaming: the cancellation lands either inside our generator (awaiting the engine:
  same path) or in Django's ``send``; then Django closes ``aiter(response)``, and
  ``EventStreamResponse.__aiter__`` closes our generator explicitly (Django's own
  wrapper would leave the inner generators to the garbage collector), which again
  aborts the engine requests at once.
"""

# Longer than 500 lines: the API's endpoints with their request checks (tools, output formats,
# legacy functions, several models, quotas); the checks are the next to move to a module of their own.
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import NinjaAPI
from ninja.parser import Parser

from conversations.accounts import quota
from conversations.api import legacy_functions, schemas
from conversations.api.auth import ApiKeyAuth
from conversations.api.completions import Generation, check_context, sampling_params
from conversations.api.docs_page import VendoredSwagger
from conversations.api.errors import (
    ApiError,
    error_from_exception,
    install_handlers,
    invalid,
    model_not_found,
    too_large,
)
from conversations.api.output_rules import chat_outputs, completion_grammar
from conversations.api.sse import DONE, sse_event
from conversations.api.tool_calls import ToolPlan, message_extras
from conversations.api.usage import CLIENT_CLOSED, RequestLog
from conversations.chat.cache_salt import cache_options, system_prompt_tokens
from conversations.ops.engine_handle import UnknownModelError, aget_engine, current_engine, model_entries
from conversations.ops.served_models import ServedModel, find_model, served_models

log = logging.getLogger(__name__)

STARTED = int(time.time())


class LimitedJsonParser(Parser):
    """JSON bodies up to ``API_MAX_BODY_BYTES``; larger ones are a 413."""

    def parse_body(self, request: HttpRequest) -> Any:
        limit = settings.API_MAX_BODY_BYTES
        size = len(request.body)
        if size > limit:
            raise too_large(limit, size)
        return json.loads(request.body)


def _record_error(request: HttpRequest, error: ApiError, exc: Exception) -> None:
    api_log: RequestLog | None = getattr(request, "api_log", None)
    if api_log is not None:
        api_log.finish(error.status, error=error.message)


api = NinjaAPI(
    title="Chat site: OpenAI-compatible API",
    version="1.0.0",
    description=(
        "The chat site's inference engine behind OpenAI's API. Point the official `openai` client at "
        "`/v1` with an API key from the site's API keys page (`Authorization: Bearer <key>`). "
        'Errors use OpenAI\'s shape: `{"error": {"message", "type", "param", "code"}}`.'
    ),
    urls_namespace="openai-api",
    docs=VendoredSwagger(),
    parser=LimitedJsonParser(),
    auth=ApiKeyAuth(),
)
install_handlers(api, _record_error)

ERRORS = {
    400: schemas.ErrorResponse,
    401: schemas.ErrorResponse,
    404: schemas.ErrorResponse,
    413: schemas.ErrorResponse,
    429: schemas.ErrorResponse,
    500: schemas.ErrorResponse,
    503: schemas.ErrorResponse,
}


def stream_doc(schema: str) -> dict[str, Any]:
    """The 200 response: JSON, or with ``stream: true`` server-sent events. The key is the int
    ninja uses, so the two merge: a string "200" would be a second, duplicate key in the JSON,
    which Swagger UI's parser rejects."""
    return {
        "responses": {
            200: {
                "description": "The completion; with `stream: true`, data-only server-sent events "
                "(`data: {chunk}` blocks, ending with `data: [DONE]`).",
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            }
        }
    }


async def ready_engine(model: str | None = None) -> Any:
    try:
        return await aget_engine(model)
    except UnknownModelError:
        raise model_not_found(model or "") from None
    except Exception as exc:
        raise ApiError(
            503, "The model is not available right now.", type="server_error", code="engine_unavailable"
        ) from exc


async def served_model(request: HttpRequest, model_id: str) -> ServedModel:
    """The model id a request names, if its key's owner may use it; else a 404."""
    is_staff = request.auth.owner.is_staff
    try:
        found = await asyncio.to_thread(find_model, model_id, is_staff)
    except Exception as exc:  # the shorthand's model is named once loaded: it did not load
        raise ApiError(
            503, "The model is not available right now.", type="server_error", code="engine_unavailable"
        ) from exc
    if found is None:
        raise model_not_found(model_id)
    check_model_access(request, found.id)
    return found


async def model_engine(request: HttpRequest, model_id: str) -> tuple[Any, ServedModel]:
    """The engine serving ``model_id`` (loaded if it is not), and the model id's record."""
    model = await served_model(request, model_id)
    return await ready_engine(engine_key(model)), model


def engine_key(model: ServedModel) -> str | None:
    """With ENGINE_MODELS, engines are found by the base's name; the shorthand's one engine
    is the default."""
    return model.base if any(e.name for e in model_entries()) else None


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


def model_card(model: ServedModel, engine: Any | None) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "created": STARTED,
        "owned_by": "chatsite",
        "root": model.root or model.id,
        "parent": model.parent,
        "max_model_len": engine.max_model_len if engine is not None else None,
    }


async def model_cards(is_staff: bool) -> list[dict[str, Any]]:
    models = await asyncio.to_thread(served_models, is_staff)
    return [model_card(m, current_engine(engine_key(m))) for m in models]


# --- Models -------------------------------------------------------------------------------


@api.get("/models", response={200: schemas.ModelList, **ERRORS}, summary="List models")
async def list_models(request: HttpRequest) -> HttpResponse:
    try:
        cards = await model_cards(request.auth.owner.is_staff)
    except Exception as exc:
        raise ApiError(
            503, "The model is not available right now.", type="server_error", code="engine_unavailable"
        ) from exc
    request.api_log.finish(200)
    cards = [card for card in cards if request.auth.access.may_use_model(card["id"])]
    return JsonResponse({"object": "list", "data": cards})


@api.get("/models/{model}", response={200: schemas.ModelCard, **ERRORS}, summary="Retrieve a model")
async def retrieve_model(request: HttpRequest, model: str) -> HttpResponse:
    request.api_log.model = model
    found = await served_model(request, model)
    request.api_log.finish(200)
    return JsonResponse(model_card(found, current_engine(engine_key(found))))


# --- Chat completions ----------------------------------------------------------------------


def _message_text(message: schemas.ChatMessage, i: int) -> str:
    content = message.content
    if content is None:
        if message.role == "assistant":
            return ""
        raise invalid(
            f"messages[{i}].content is required for the {message.role} role.", param=f"messages[{i}].content"
        )
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


async def encode_chat(
    engine: Any, messages: list[dict[str, str]], shared: bool = False
) -> tuple[list[int], int]:
    """The prompt's ids and, if ``shared``, how many of them a leading system prompt's
    block share (``system_prompt_tokens``): one trip to a worker thread for both."""
    tokenizer = engine.tokenizer

    def encode() -> tuple[list[int], int]:
        prompt = tokenizer.encode_chat(messages)  # linear in the messages: no length limit
        return prompt, system_prompt_tokens(tokenizer, messages, prompt) if shared else 0

    try:
        return await asyncio.to_thread(encode)
    except Exception as exc:  # the chat template rejected the conversation (jinja raise_exception)
        raise invalid(
            f"The messages could not be rendered with the model's chat template: {exc}", param="messages"
        ) from exc


@api.post(
    "/chat/completions",
    response={200: schemas.ChatCompletion, **ERRORS},
    summary="Create a chat completion",
    openapi_extra=stream_doc("ChatCompletion"),
)
async def chat_completions(request: HttpRequest, body: schemas.ChatCompletionRequest) -> HttpResponse:
    api_log: RequestLog = request.api_log
    api_log.model, api_log.stream = body.model, bool(body.stream)
    check_fan_out(body.n, 1)
    check_stream_options(body)
    body, legacy = legacy_functions.as_tools(body)
    engine, served = await model_engine(request, body.model)
    top_logprobs = None
    if body.logprobs:
        top_logprobs = body.top_logprobs or 0
    elif body.top_logprobs is not None:
        raise invalid("top_logprobs needs logprobs to be true.", param="top_logprobs")
    messages = [
        {
            "role": "system" if m.role == "developer" else m.role,
            "content": _message_text(m, i),
            **message_extras(m),
        }
        for i, m in enumerate(body.messages)
    ]
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = sampling_params(
        body, max_tokens, top_logprobs, chat=True, vocab_size=engine.tokenizer.vocab_size
    )
    outputs = await chat_outputs(engine, body, messages, engine_owner(request))
    messages, params.grammar = outputs.messages, outputs.grammar
    # A leading system prompt's blocks are shared with everyone, as the chat's are.
    prompt, shared = await encode_chat(engine, messages, shared=not body.cache_salt)
    check_context(engine, [prompt], max_tokens, "messages")
    admitted = await admit_tokens(request, (body.n or 1) * len(prompt))
    generation = Generation(
        engine,
        kind="chat",
        prompts=[prompt],
        params=params,
        prompt_param="messages",
        top_logprobs=top_logprobs,
        owner=engine_owner(request),
        cache=engine_cache(request, body.cache_salt, shared),
        admission=admitted,
        model=served.id,
        adapter=served.adapter,
    )
    legacy = legacy_functions.LegacyAnswer(outputs.tools) if legacy else None
    return await respond(request, generation, body, legacy or outputs.tools)


# --- Text completions ----------------------------------------------------------------------


async def encode_prompts(engine: Any, prompt: Any) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of the prompt(s): a string, strings, token ids, or lists of them."""
    tokenizer = engine.tokenizer
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if isinstance(prompt[0], str):
        texts = list(prompt)
        ids = await asyncio.to_thread(lambda: [tokenizer.encode(t) for t in texts])
        return ids, texts
    ids = [list(p) for p in prompt]
    for p, seq in enumerate(ids):
        bad = next((t for t in seq if t >= tokenizer.vocab_size), None)
        if bad is not None:
            param = "prompt" if len(ids) == 1 else f"prompt[{p}]"
            raise invalid(
                f"Token id {bad} is out of the vocabulary (size {tokenizer.vocab_size}).", param=param
            )
    texts = await asyncio.to_thread(lambda: [tokenizer.decode(seq) for seq in ids])
    return ids, texts


@api.post(
    "/completions",
    response={200: schemas.Completion, **ERRORS},
    summary="Create a text completion",
    openapi_extra=stream_doc("Completion"),
)
async def completions(request: HttpRequest, body: schemas.CompletionRequest) -> HttpResponse:
    api_log: RequestLog = request.api_log
    api_log.model, api_log.stream = body.model, bool(body.stream)
    check_fan_out(body.n, count_prompts(body.prompt))
    check_stream_options(body)
    engine, served = await model_engine(request, body.model)
    scores_prompt = bool(body.echo) and body.logprobs is not None
    if scores_prompt and body.use_beam_search:
        raise invalid("echo with logprobs is not available with use_beam_search.", param="echo")
    if body.max_tokens == 0 and (body.n or 1) > 1:
        raise invalid("max_tokens 0 (score the prompt) takes n = 1.", param="n")
    params = sampling_params(
        body,
        body.max_tokens,
        body.logprobs,
        vocab_size=engine.tokenizer.vocab_size,
        prompt_logprobs=body.logprobs if scores_prompt else None,
    )
    params.grammar = await completion_grammar(engine, body, engine_owner(request))
    prompts, texts = await encode_prompts(engine, body.prompt)
    check_context(engine, prompts, body.max_tokens, "prompt")
    admitted = await admit_tokens(request, (body.n or 1) * sum(len(p) for p in prompts))
    generation = Generation(
        engine,
        kind="completion",
        prompts=prompts,
        params=params,
        prompt_param="prompt",
        echo=texts if body.echo else None,
        owner=engine_owner(request),
        cache=engine_cache(request, body.cache_salt),
        admission=admitted,
        model=served.id,
        adapter=served.adapter,
    )
    return await respond(request, generation, body)


# --- Responses -----------------------------------------------------------------------------


def _usage_fields(generation: Generation) -> dict[str, Any]:
    usage = generation.usage()
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
    }


async def respond(
    request: HttpRequest,
    generation: Generation,
    body: Any,
    tools: ToolPlan | legacy_functions.LegacyAnswer | None = None,
) -> HttpResponse:
    api_log: RequestLog = request.api_log
    api_log.request_id = generation.id
    if not body.stream:
        try:
            async for _ in generation.deltas():
                pass
        except asyncio.CancelledError:
            api_log.finish(CLIENT_CLOSED, finish_reason="abort", **_usage_fields(generation))
            raise
        response = generation.response_body()
        response = tools.rewrite_body(response) if tools else response
        finish = tools.finish_reason(generation.finish_reason) if tools else generation.finish_reason
        api_log.finish(200, finish_reason=finish, **_usage_fields(generation))
        return JsonResponse(response)

    options = body.stream_options
    include_usage = bool(options and options.include_usage)
    continuous = bool(options and options.continuous_usage_stats)
    deltas = generation.deltas()
    # The first delta comes before the response starts, so that a prompt over the
    # context window or a full queue is still an HTTP error, not an event.
    try:
        first = await anext(deltas)
    except StopAsyncIteration:
        first = None
    except asyncio.CancelledError:
        api_log.finish(CLIENT_CLOSED, finish_reason="abort")
        raise
    return EventStreamResponse(
        event_stream(generation, deltas, first, include_usage, api_log, tools, continuous)
    )


async def event_stream(
    generation: Generation,
    deltas: AsyncIterator[Any],
    first: Any,
    include_usage: bool,
    api_log: RequestLog,
    tools: ToolPlan | legacy_functions.LegacyAnswer | None = None,
    continuous: bool = False,
) -> AsyncIterator[bytes]:
    """The response's events; the chunks of one engine delta go out as one write.
    ``continuous`` (vLLM's ``continuous_usage_stats``): every chunk carries the usage so far."""
    status, error, finish_reason = CLIENT_CLOSED, "", "abort"
    # Tools: content deltas become tool_calls deltas (conversations.api.tool_calls).
    rewrite = tools.rewrite_chunk if tools else lambda choices: [choices]

    def events(chunks: list[list[dict[str, Any]]], opening: bool = False) -> bytes:
        usage = generation.usage() if continuous else None
        if usage is not None and opening:  # the role chunks come before any output
            usage = {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}
        return b"".join(
            sse_event(generation.chunk(c, include_usage or continuous, usage))
            for chunk in chunks
            for c in rewrite(chunk)
        )

    try:
        opening = events(generation.opening_chunks(), opening=True)
        last = b""  # the last delta's chunks go out with the usage and [DONE]: one write
        if first is not None:
            yield opening + events(generation.delta_chunks(*first))
            async for choice, delta in deltas:
                out = events(generation.delta_chunks(choice, delta))
                if delta.request_finished and generation.all_finished:
                    last = out
                    break
                if out:
                    yield out
        elif opening:
            yield opening
        tail = sse_event(generation.chunk([], True, generation.usage())) if include_usage else b""
        status, finish_reason = 200, generation.finish_reason
        finish_reason = tools.finish_reason(finish_reason) if tools else finish_reason
        yield last + tail + DONE
        # Streams that finish in one engine step all write their last words before any of
        # them is torn down (the response's end, its access log line, its usage row): else
        # the later ones' last tokens would wait behind the earlier ones' teardowns.
        await asyncio.sleep(0)
    except Exception as exc:
        api_error = error_from_exception(exc)
        if api_error.status >= 500:
            log.error("API stream failed", exc_info=exc)
        status, error, finish_reason = api_error.status, api_error.message, "error"
        yield sse_event(api_error.body())
        yield DONE
    finally:
        await deltas.aclose()  # aborts the engine requests if they still run
        api_log.finish(status, finish_reason=finish_reason, error=error, **_usage_fields(generation))


class EventStreamResponse(StreamingHttpResponse):
    """Server-sent events whose generator is closed as soon as Django stops sending."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        super().__init__(events, content_type="text/event-stream")
        self._events = events
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The generator itself, not a wrapper around it: Django closes what this returns
        # (``aclosing``), so the generator's ``finally`` runs at once.
        return self._events
