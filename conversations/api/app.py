"""The OpenAI-compatible API, mounted at /v1 (OpenAPI document at /v1/openapi.json, docs at /v1/docs):
its endpoints for models, chat completions and text completions. A request's checks are in
``conversations.api.request_checks``; its answer, whole or streamed, in ``conversations.api.responding``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.parser import Parser

from conversations.api import legacy_functions, schemas
from conversations.api.auth import ApiKeyAuth
from conversations.api.completions import Generation
from conversations.api.docs_page import VendoredSwagger
from conversations.api.errors import ApiError, install_handlers, invalid, model_not_found, too_large
from conversations.api.output_rules import chat_outputs, completion_grammar
from conversations.api.request_checks import (
    admit_tokens,
    check_fan_out,
    check_model_access,
    check_stream_options,
    count_prompts,
    engine_cache,
    engine_owner,
)
from conversations.api.request_params import check_context, sampling_params
from conversations.api.responding import respond
from conversations.api.tool_calls import message_extras
from conversations.api.usage import RequestLog
from conversations.chat.cache_salt import system_prompt_tokens
from conversations.ops.engine_handle import UnknownModelError, aget_engine, current_engine, model_entries
from conversations.ops.served_models import ServedModel, find_model, served_models

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
    engine: Any, messages: list[dict[str, Any]], shared: bool = False, tools: list[dict] | None = None
) -> tuple[list[int], int]:
    """The prompt's ids and, if ``shared``, how many of them a leading system prompt's
    block share (``system_prompt_tokens``): one trip to a worker thread for both. ``tools``
    go to the template (a format that leaves them to it), whose system part then holds them:
    nothing is shared."""
    tokenizer = engine.tokenizer

    def encode() -> tuple[list[int], int]:
        prompt = tokenizer.encode_chat(messages, tools=tools)  # linear in the messages
        return prompt, system_prompt_tokens(tokenizer, messages, prompt) if shared and not tools else 0

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
    tools = outputs.tools.template_tools if outputs.tools is not None else None
    prompt, shared = await encode_chat(engine, messages, shared=not body.cache_salt, tools=tools)
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
