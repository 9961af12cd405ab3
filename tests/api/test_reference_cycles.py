"""What a finished request leaves behind is freed by reference counting alone. Anything left
in a reference cycle waits for a full garbage collection, which pauses every thread of the
process for as long as it walks the heap: under load, hundreds of milliseconds every few
seconds, the worst token delay of every stream."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import httpx2
import openai
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest

from conversations.api.handler import ApiHandler
from conversations.models import ApiKey
from tests.api.conftest import chat
from tests.support.api_engine import serve_in_process


class StreamingEngine:
    """Stands in for the engine in this process: three deltas, then the end."""

    model_name = "streaming-model"
    max_model_len = 256
    tokenizer = SimpleNamespace(encode_chat=lambda messages, tools=None: [1, 2, 3], vocab_size=100)

    async def stream(self, prompt, params, request_id=None, **options):  # owner, cache_salt
        from inference.engine.outputs import StreamDelta

        for i in range(3):
            last = i == 2
            yield StreamDelta(
                request_id, 0, "ok", [7], last, "length" if last else None, 3, 0, i + 1, request_finished=last
            )

    def abort(self, request_id: str) -> None:
        pass


@pytest.fixture
def raw_key(api_user) -> str:
    return ApiKey.objects.create_key(api_user)[1]


def client_on(handler, raw: str) -> openai.AsyncOpenAI:
    transport = httpx2.ASGITransport(app=handler)
    http_client = httpx2.AsyncClient(transport=transport, base_url="http://testserver")
    return openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key=raw, max_retries=0, http_client=http_client
    )


async def stream_one(client: openai.AsyncOpenAI) -> str:
    stream = await client.chat.completions.create(model="streaming-model", messages=chat(), stream=True)
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])


@pytest.fixture
def streaming_engine(monkeypatch):
    engine = StreamingEngine()

    serve_in_process(monkeypatch, engine)


async def test_a_streamed_api_call_leaves_no_request_in_a_reference_cycle(
    streaming_engine, raw_key, garbage
) -> None:
    client = client_on(ApiHandler(), raw_key)
    assert await stream_one(client) == "okokok"
    await client.close()
    gc.collect()
    assert [o for o in garbage if isinstance(o, HttpRequest)] == []


async def test_djangos_disconnect_listener_would_leave_one(streaming_engine, raw_key, garbage) -> None:
    """The check above can see the cycle: with Django's listener, whose ``RequestAborted``
    the handler re-raises through its own frame, the request is left in one."""

    class WithDjangosListener(ApiHandler):
        listen_for_disconnect = ASGIHandler.listen_for_disconnect

    client = client_on(WithDjangosListener(), raw_key)
    assert await stream_one(client) == "okokok"
    await client.close()
    gc.collect()
    assert [o for o in garbage if isinstance(o, HttpRequest)] != []
