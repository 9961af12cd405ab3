"""``POST /v1/embeddings`` in OpenAI's shape.

Vectors come from ``conversations.documents.embedder``: the served model's mean-pooled,
L2-normalised last hidden state (as vLLM pools decoder models), or the ``EMBEDDING_MODEL``
encoder. ``encoding_format: "base64"`` is the little-endian float32 bytes, base64-encoded,
which is what the official client decodes.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any, Literal

import numpy as np
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, Schema
from pydantic import ConfigDict

from conversations.api.app import ERRORS, api
from conversations.api.errors import ApiError, invalid, model_not_found
from conversations.api.request_checks import engine_owner
from conversations.api.usage import RequestLog
from conversations.documents.embedder import aget_embedder

# OpenAI's own limit on inputs per request.
MAX_INPUTS = 2048
# Tokens one request may embed in all. The engine embeds in chunks between its steps, sized
# like a step's prompt tokens, so streams keep their pace; this bounds one request's share
# of the engine's embedding queue (bounded too: a 429 when it is full).
MAX_TOTAL_TOKENS = 32_768

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingRequest(Schema):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [{"model": "SmolLM2-135M-Instruct", "input": "The food was delicious"}]
        },
    )
    model: str
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class EmbeddingItem(Schema):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Schema):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Schema):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


def _inputs(raw: Any) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists)."""
    if isinstance(raw, str):
        return [raw], None
    if isinstance(raw[0], str):
        return list(raw), None
    if isinstance(raw[0], int):
        return None, [list(raw)]
    return None, [list(x) for x in raw]


def _check_ids(ids: list[list[int]], vocab_size: int, limit: int) -> None:
    total = sum(len(seq) for seq in ids)
    if total > MAX_TOTAL_TOKENS:
        raise invalid(
            f"This request has {total} tokens in all; at most {MAX_TOTAL_TOKENS} are embedded per request.",
            param="input",
            code="too_many_tokens",
        )
    for i, seq in enumerate(ids):
        param = "input" if len(ids) == 1 else f"input[{i}]"
        if not seq:
            raise invalid("An input is empty: each input needs at least one token.", param=param)
        if len(seq) > limit:
            raise invalid(
                f"This input has {len(seq)} tokens; the model takes at most {limit} per input.",
                param=param,
                code="context_length_exceeded",
            )
        bad = next((t for t in seq if t >= vocab_size), None)
        if bad is not None:
            raise invalid(f"Token id {bad} is out of the vocabulary (size {vocab_size}).", param=param)


def _encoded(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


@api.post("/embeddings", response={200: EmbeddingList, **ERRORS}, summary="Create embeddings")
async def create_embeddings(request: HttpRequest, body: EmbeddingRequest) -> HttpResponse:
    api_log: RequestLog = request.api_log
    api_log.model = body.model
    try:
        embedder = await aget_embedder()
    except Exception as exc:
        raise ApiError(
            503,
            "The embedding model is not available right now.",
            type="server_error",
            code="engine_unavailable",
        ) from exc
    if body.model != embedder.model_name:
        raise model_not_found(body.model)
    texts, ids = _inputs(body.input)
    if texts is not None:
        if any(not t for t in texts):
            raise invalid("An input is an empty string: each input needs some text.", param="input")
        ids = await asyncio.to_thread(lambda: [embedder.encode(t) for t in texts])
    assert ids is not None
    _check_ids(ids, embedder.vocab_size, embedder.max_input_tokens)
    from inference.errors import EngineOverloadedError  # noqa: PLC0415 - workers import no engine code

    try:
        vectors = await embedder.aembed_ids(ids, engine_owner(request))
    except EngineOverloadedError as exc:
        raise ApiError(
            429,
            f"The engine's embedding queue is full: {exc}. Please retry after a short wait.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": "2"},
        ) from exc
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise invalid(
            f"This model's embeddings have {vectors.shape[1]} dimensions and cannot be shortened.",
            param="dimensions",
        )
    tokens = sum(len(seq) for seq in ids)
    api_log.finish(200, prompt_tokens=tokens)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JsonResponse({"object": "list", "data": data, "model": embedder.model_name, "usage": usage})
