"""Every error in OpenAI's shape, through the official client: 401, 404, 400, 413, 429, 500."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
import httpx2
import openai
import pytest

from conversations.models import ApiKey
from tests.api.conftest import chat, wait_for_rows
from tests.support.api_engine import serve_in_process

pytestmark = pytest.mark.timeout(120)


def assert_openai_shape(body: dict, status_type: str | None = None) -> dict:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if status_type:
        assert error["type"] == status_type
    return error


# --- 401 ---------------------------------------------------------------------------------


@pytest.mark.smoke
def test_401_without_a_key(live_site, api_key, model_name):
    response = httpx.post(
        f"{live_site.url}/v1/chat/completions", json={"model": model_name, "messages": chat()}
    )
    assert response.status_code == 401
    assert_openai_shape(response.json(), "invalid_request_error")

    with openai.OpenAI(base_url=f"{live_site.url}/v1", api_key="unused", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            c.models.list(extra_headers={"Authorization": openai.Omit()})
    assert info.value.status_code == 401
    assert "didn't provide an API key" in assert_openai_shape(info.value.response.json())["message"]


def test_401_with_an_unknown_key(live_site, api_key, model_name):
    with openai.OpenAI(
        base_url=f"{live_site.url}/v1", api_key="sk-not-a-real-key-0123456789", max_retries=0
    ) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            c.chat.completions.create(model=model_name, messages=chat())
    error = assert_openai_shape(info.value.response.json(), "invalid_request_error")
    assert error["code"] == "invalid_api_key"
    assert "sk-not-a-real-key" not in error["message"]  # only a masked form is echoed


def test_401_with_a_revoked_key(live_site, api_user, model_name, api_key):
    key, raw = ApiKey.objects.create_key(api_user)
    with openai.OpenAI(base_url=f"{live_site.url}/v1", api_key=raw, max_retries=0) as c:
        assert c.models.list().data  # works until revoked
        key.revoke()
        with pytest.raises(openai.AuthenticationError) as info:
            c.models.list()
    assert "revoked" in assert_openai_shape(info.value.response.json())["message"]


# --- 404 ---------------------------------------------------------------------------------


@pytest.mark.smoke
def test_404_for_an_unknown_model(openai_client):
    for call in (
        lambda: openai_client.chat.completions.create(model="gpt-17", messages=chat()),
        lambda: openai_client.completions.create(model="gpt-17", prompt="hi"),
        lambda: openai_client.models.retrieve("gpt-17"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        error = assert_openai_shape(info.value.response.json(), "invalid_request_error")
        assert error["code"] == "model_not_found"
        assert "gpt-17" in error["message"]


def test_404_for_an_unknown_path_is_json_too(live_site, api_key):
    response = httpx.get(f"{live_site.url}/v1/no/such/thing", headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 404
    assert_openai_shape(response.json(), "invalid_request_error")


# --- 400 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": []}, "messages"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"stop": [""]}, "stop[0]"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"seed": "abc"}, "seed"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"use_beam_search": True}, "stop": "x"}, "stop"),
    ],
)
def test_400_for_an_invalid_field_names_the_param(openai_client, model_name, fields, param):
    args = {"model": model_name, "messages": chat(), "max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(**args)
    error = assert_openai_shape(info.value.response.json(), "invalid_request_error")
    assert error["param"] == param, error


def test_400_for_malformed_json(live_site, api_key):
    response = httpx.post(
        f"{live_site.url}/v1/chat/completions",
        content=b'{"model": ',
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert_openai_shape(response.json(), "invalid_request_error")


@pytest.mark.smoke
def test_400_for_a_prompt_over_the_context_window_states_tokens_and_limit(
    openai_client, model_name, api_user
):
    limit = openai_client.models.list().data[0].model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=model_name, prompt=[5] * (limit + 52), max_tokens=1)
    error = assert_openai_shape(info.value.response.json())
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"resulted in {limit + 52} tokens" in error["message"]
    assert f"maximum context length is {limit} tokens" in error["message"]

    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=model_name, messages=chat("hello " * (limit + 10)))
    error = assert_openai_shape(info.value.response.json())
    assert error["param"] == "messages"
    count = int(re.search(r"resulted in (\d+) tokens", error["message"]).group(1))
    assert count > limit and str(limit) in error["message"]

    # A prompt that fits, but not with the completion asked for.
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=model_name, prompt=[5] * 100, max_tokens=limit)
    assert (
        f"you requested {limit + 100} tokens (100 in the prompt, {limit} in the completion)"
        in (assert_openai_shape(info.value.response.json())["message"])
    )
    rows = wait_for_rows(api_user, 4)
    assert [r.status_code for r in rows] == [200, 400, 400, 400]


# --- 413 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1_100_000, 3_000_000], ids=["over-api-limit", "over-django-limit"])
def test_413_for_a_body_over_the_limit(openai_client, model_name, size):
    with pytest.raises(openai.APIStatusError) as info:
        openai_client.chat.completions.create(model=model_name, messages=chat("x" * size))
    assert info.value.status_code == 413
    error = assert_openai_shape(info.value.response.json(), "invalid_request_error")
    assert error["code"] == "request_too_large"
    assert "1000000" in error["message"]


# --- 429 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def overloaded_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """A second site whose engine accepts no waiting request: every generation is refused."""
    from tests.live_site import start_live_site, stop_live_site

    site = start_live_site(
        tiny_model_dir,
        tmp_path_factory.mktemp("overloaded-site"),
        ENGINE_MAX_WAITING="0",
        ENGINE_KV_CACHE_GB="0.02",
    )
    yield site
    stop_live_site(site)


def test_429_when_the_waiting_queue_is_over_the_limit(overloaded_site, api_key, model_name, api_user):
    with openai.OpenAI(base_url=f"{overloaded_site.url}/v1", api_key=api_key, max_retries=0) as c:
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as info:
                c.chat.completions.create(model=model_name, messages=chat(), max_tokens=2, stream=stream)
            assert info.value.status_code == 429
            assert info.value.response.headers["Retry-After"] == "1"
            error = assert_openai_shape(info.value.response.json(), "rate_limit_error")
            assert error["code"] == "rate_limit_exceeded"
    assert {r.status_code for r in wait_for_rows(api_user, 2)} == {429}


# --- 500 ---------------------------------------------------------------------------------

SECRET = "secret-internal-detail /srv/engine.py line 42"


class BrokenEngine:
    """Stands in for the engine in this process: fails after ``good_deltas`` deltas."""

    model_name = "broken-model"
    max_model_len = 256
    tokenizer = SimpleNamespace(encode_chat=lambda messages, tools=None: [1, 2, 3], vocab_size=100)

    def __init__(self, good_deltas: int = 0) -> None:
        self.good_deltas = good_deltas
        self.aborted: list[str] = []

    async def stream(self, prompt, params, request_id=None, **options):  # owner, cache_salt
        from inference.engine.outputs import StreamDelta

        for i in range(self.good_deltas):
            yield StreamDelta(request_id, 0, "ok", [7], False, None, 3, 0, i + 1)
        raise RuntimeError(SECRET)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@pytest.fixture
def in_process_client(api_user, monkeypatch):
    """The official async client on the ASGI application in this process, with a broken engine."""
    from django.core.asgi import get_asgi_application

    engine = BrokenEngine()

    serve_in_process(monkeypatch, engine)
    _key, raw = ApiKey.objects.create_key(api_user)
    transport = httpx2.ASGITransport(app=get_asgi_application())
    http_client = httpx2.AsyncClient(transport=transport, base_url="http://testserver")
    client = openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key=raw, max_retries=0, http_client=http_client
    )
    return client, engine


async def test_500_has_the_openai_shape_and_no_traceback(in_process_client):
    openai_client, _engine = in_process_client
    with pytest.raises(openai.InternalServerError) as info:
        await openai_client.chat.completions.create(model="broken-model", messages=chat(), max_tokens=2)
    assert info.value.status_code == 500
    error = assert_openai_shape(info.value.response.json(), "server_error")
    text = info.value.response.text
    assert SECRET not in text and "Traceback" not in text and "RuntimeError" not in text
    assert error["code"] == "internal_error"


async def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_event(in_process_client):
    openai_client, engine = in_process_client
    engine.good_deltas = 2
    stream = await openai_client.chat.completions.create(model="broken-model", messages=chat(), stream=True)
    received = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            received.append(chunk)
    assert [c.choices[0].delta.content for c in received] == ["", "ok", "ok"]
    assert SECRET not in str(info.value.body) and "Traceback" not in str(info.value.body)
    assert engine.aborted  # the engine request is always closed


async def test_a_request_that_finished_is_not_aborted_again(in_process_client):
    """Only an engine request still running when its call ends is aborted: a finished one's
    abort would be one more command for the engine thread per call."""
    from inference.engine.outputs import StreamDelta

    openai_client, engine = in_process_client

    async def finish(prompt, params, request_id=None, **options):
        yield StreamDelta(request_id, 0, "ok", [7], True, "length", 3, 0, 1, request_finished=True)

    engine.stream = finish
    stream = await openai_client.chat.completions.create(model="broken-model", messages=chat(), stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "ok"
    assert engine.aborted == []


async def test_a_prompt_token_id_the_engine_refuses_is_a_400_naming_the_param(in_process_client):
    """The engine's ``InvalidPromptError`` (an id outside the model's vocabulary, e.g. from
    messages a client kept from another model) is the caller's error, mapped like a prompt
    over the context window."""
    from inference.errors import InvalidPromptError

    openai_client, engine = in_process_client

    async def refuse(prompt, params, request_id=None, **options):
        raise InvalidPromptError(117, 3, 100)
        yield  # an async generator, like the engine's

    engine.stream = refuse
    with pytest.raises(openai.BadRequestError) as info:
        await openai_client.chat.completions.create(model="broken-model", messages=chat(), max_tokens=2)
    error = assert_openai_shape(info.value.response.json(), "invalid_request_error")
    assert error["param"] == "messages"
    assert error["message"] == "Token id 117 is out of the vocabulary (size 100)."
