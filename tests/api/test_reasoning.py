"""Chat completions from a reasoning model: ``reasoning_content`` (DeepSeek's field) in
the message and in stream deltas, apart from ``content``; earlier reasoning that a
client sends back is not given to the model."""

from __future__ import annotations

import pytest

from tests.support.api_engine import in_process_openai_client
from tests.support.fakes import SCRIPTED_ANSWER, SCRIPTED_REASONING, scripted_reasoning_model

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def reasoning_client(api_user, monkeypatch):
    """The official async client on this process's ASGI app, over an engine whose model
    marks reasoning in its template and answers with a fixed think + answer."""

    from inference import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(device="cpu", num_kv_blocks=32), loaded=scripted_reasoning_model())
    prompts: list[list[int]] = []
    stream = engine.stream

    def recording_stream(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return stream(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "stream", recording_stream)

    client = in_process_openai_client(monkeypatch, engine, api_user)
    yield client, engine, prompts
    engine.shutdown()


async def test_the_message_carries_reasoning_content_apart_from_the_answer(reasoning_client):
    client, engine, _prompts = reasoning_client
    response = await client.chat.completions.create(
        model=engine.model_name, messages=[{"role": "user", "content": "Capital of France?"}], max_tokens=40
    )
    message = response.choices[0].message
    assert message.content == SCRIPTED_ANSWER, message
    assert message.model_extra["reasoning_content"] == SCRIPTED_REASONING
    assert response.choices[0].finish_reason == "stop"


async def test_stream_deltas_carry_reasoning_content_then_content(reasoning_client):
    client, engine, _prompts = reasoning_client
    stream = await client.chat.completions.create(
        model=engine.model_name,
        messages=[{"role": "user", "content": "Capital?"}],
        max_tokens=40,
        stream=True,
    )
    reasoning, content, order = [], [], []
    async for chunk in stream:
        delta = chunk.choices[0].delta
        extra = (delta.model_extra or {}).get("reasoning_content")
        if extra:
            reasoning.append(extra)
            order.append("reasoning")
        if delta.content:
            content.append(delta.content)
            order.append("content")
    assert "".join(reasoning) == SCRIPTED_REASONING and "".join(content) == SCRIPTED_ANSWER
    assert len(reasoning) > 1 and order == sorted(order, key=lambda kind: kind != "reasoning")


async def test_reasoning_sent_back_by_the_client_never_reaches_the_model(reasoning_client):
    client, engine, prompts = reasoning_client
    history = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": SCRIPTED_ANSWER, "reasoning_content": SCRIPTED_REASONING},
        {"role": "user", "content": "And of Spain?"},
    ]
    await client.chat.completions.create(model=engine.model_name, messages=history, max_tokens=40)
    text = engine.tokenizer.decode(prompts[-1], skip_special_tokens=False)
    assert SCRIPTED_REASONING not in text and SCRIPTED_ANSWER in text


async def test_text_completions_keep_the_think_tags_in_the_text(reasoning_client):
    client, engine, _prompts = reasoning_client
    prompt = engine.tokenizer.decode(engine.tokenizer.encode_chat([{"role": "user", "content": "Q?"}]), False)
    response = await client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=40)
    assert response.choices[0].text == f"{SCRIPTED_REASONING}</think> {SCRIPTED_ANSWER}"
