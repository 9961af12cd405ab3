"""Stand-in engines for `/v1` calls made in the test process."""

from __future__ import annotations

from typing import Any


def serve_in_process(monkeypatch: Any, engine: Any) -> None:
    """Every `/v1` call in this process meets ``engine``: the API's engine lookup, and the model
    catalogue, which names the one-model shorthand's model after its loaded engine."""

    async def aget_engine(model: str | None = None) -> Any:
        return engine

    monkeypatch.setattr("conversations.api.app.aget_engine", aget_engine)
    monkeypatch.setattr("conversations.ops.engine_handle.get_engine", lambda model=None, **_: engine)
    # An engine an earlier test loaded in this process would name the catalogue's model.
    monkeypatch.setattr("conversations.ops.engine_handle.model_names", lambda: [engine.model_name])


def serve_no_engine(monkeypatch: Any) -> None:
    """Every `/v1` call that needs the engine or the model catalogue finds none (a 503)."""

    def unavailable(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("no engine in this test")

    async def aget_engine(model: str | None = None) -> Any:
        unavailable()

    monkeypatch.setattr("conversations.api.app.aget_engine", aget_engine)
    monkeypatch.setattr("conversations.ops.engine_handle.get_engine", unavailable)
    # An engine an earlier test loaded in this process would name the catalogue's model.
    monkeypatch.setattr("conversations.ops.engine_handle.model_names", lambda: [""])


def in_process_openai_client(monkeypatch: Any, engine: Any, user: Any) -> Any:
    """An ``openai.AsyncOpenAI`` for ``user`` (a fresh API key) talking to this process's
    ASGI app, which serves ``engine``."""
    import httpx2
    import openai
    from django.core.asgi import get_asgi_application

    from conversations.models import ApiKey

    serve_in_process(monkeypatch, engine)
    _key, raw = ApiKey.objects.create_key(user)
    http_client = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=get_asgi_application()), base_url="http://t"
    )
    return openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key=raw, max_retries=0, http_client=http_client
    )
