"""The answer to a completion request: one JSON body, or a stream of server-sent events.

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

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from conversations.api import legacy_functions
from conversations.api.completions import Generation
from conversations.api.errors import error_from_exception
from conversations.api.sse import DONE, sse_event
from conversations.api.tool_calls import ToolPlan
from conversations.api.usage import CLIENT_CLOSED, RequestLog

log = logging.getLogger(__name__)


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
