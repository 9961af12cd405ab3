"""The official openai client, sync and async, against a live site on the tiny model."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conversations.models import Conversation
from tests.api.conftest import chat, parse_sse, wait_for_rows

pytestmark = pytest.mark.timeout(120)

UNTIL_MAX = {"ignore_eos": True}  # a random-weight model may emit EOS at any point


# --- chat, sync -------------------------------------------------------------------------


@pytest.mark.smoke
def test_models_lists_the_served_model(openai_client, model_name):
    models = openai_client.models.list().data
    assert [m.id for m in models] == [model_name]
    assert models[0].object == "model"
    assert openai_client.models.retrieve(model_name).id == model_name


@pytest.mark.smoke
def test_chat_completion_returns_text_finish_reason_and_usage_and_counts_against_the_owner(
    openai_client, model_name, api_user
):
    response = openai_client.chat.completions.create(
        model=model_name, messages=chat(), max_tokens=5, temperature=0, extra_body=UNTIL_MAX
    )
    assert response.id.startswith("chatcmpl-")
    assert response.object == "chat.completion"
    assert response.model == model_name
    assert response.created > 0
    [choice] = response.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert response.usage.completion_tokens == 5
    assert response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + 5

    [row] = wait_for_rows(api_user, 1)
    assert (row.endpoint, row.status_code, row.stream) == ("/v1/chat/completions", 200, False)
    assert row.request_id == response.id
    assert row.key.name == "tests"
    assert (row.prompt_tokens, row.completion_tokens) == (response.usage.prompt_tokens, 5)
    assert row.finish_reason == "length"
    assert not Conversation.objects.exists()


def test_chat_accepts_every_role_and_text_parts_and_max_completion_tokens(openai_client, model_name):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again?"},
    ]
    response = openai_client.chat.completions.create(
        model=model_name, messages=messages, max_completion_tokens=3, extra_body=UNTIL_MAX
    )
    assert response.usage.completion_tokens == 3
    assert response.choices[0].finish_reason == "length"


@pytest.mark.smoke
def test_chat_stream_shares_one_id_starts_with_the_role_and_ends_with_usage(openai_client, model_name):
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=chat(),
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=UNTIL_MAX,
    )
    chunks = list(stream)
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert {c.created for c in chunks} == {chunks[0].created}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.delta.role is None for c in chunks[1:] for ch in c.choices)
    *content_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 6
    assert all(c.usage is None for c in content_chunks)
    assert [c.choices[0].finish_reason for c in content_chunks][-1] == "length"
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text


def test_raw_stream_is_data_only_events_ending_with_done(live_site, api_key, model_name):
    body = {"model": model_name, "messages": chat(), "max_tokens": 4, "stream": True, **UNTIL_MAX}
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.stream(
        "POST", f"{live_site.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.read().decode())
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in events[0]  # only with stream_options.include_usage


def test_stop_strings_end_the_answer_before_the_stop_text(openai_client, model_name):
    greedy = {"model": model_name, "messages": chat("Tell me a story."), "temperature": 0, "max_tokens": 24}
    full = openai_client.chat.completions.create(**greedy, extra_body=UNTIL_MAX).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.index(stop)]
    for stops in (stop, ["no-such-text-zq", stop]):
        choice = openai_client.chat.completions.create(**greedy, stop=stops, extra_body=UNTIL_MAX).choices[0]
        assert choice.message.content == expected
        assert choice.finish_reason == "stop"


def test_n_2_returns_two_indexed_choices_and_counts_both(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=chat(), n=2, max_tokens=5, seed=7, extra_body=UNTIL_MAX
    )
    assert [c.index for c in response.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in response.choices)
    assert response.usage.completion_tokens == 10


def test_a_seed_reproduces_a_sampled_answer(openai_client, model_name):
    args = {
        "model": model_name,
        "messages": chat(),
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": UNTIL_MAX,
    }
    first = openai_client.chat.completions.create(**args, seed=1234).choices[0].message.content
    again = openai_client.chat.completions.create(**args, seed=1234).choices[0].message.content
    other = openai_client.chat.completions.create(**args, seed=4321).choices[0].message.content
    assert first == again
    assert first != other


def test_logprobs_give_each_token_and_its_top_alternatives(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=chat(), max_tokens=4, logprobs=True, top_logprobs=3, extra_body=UNTIL_MAX
    )
    content = response.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob


def test_vllm_extensions_are_honoured(openai_client, model_name):
    base = {"model": model_name, "messages": chat(), "max_tokens": 8}
    greedy = (
        openai_client.chat.completions.create(**base, temperature=0, extra_body=UNTIL_MAX)
        .choices[0]
        .message.content
    )
    top1 = openai_client.chat.completions.create(
        **base, temperature=1.0, extra_body={"top_k": 1, **UNTIL_MAX}
    )
    assert top1.choices[0].message.content == greedy
    tuned = openai_client.chat.completions.create(
        **base,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        top_p=0.9,
        extra_body={"min_p": 0.05, "repetition_penalty": 1.2, **UNTIL_MAX},
    )
    assert tuned.usage.completion_tokens == 8
    beams = openai_client.chat.completions.create(
        **base, n=2, temperature=0, extra_body={"use_beam_search": True, "length_penalty": 1.0, **UNTIL_MAX}
    )
    assert [c.index for c in beams.choices] == [0, 1]
    assert all(c.message.content for c in beams.choices)


# --- text completions -------------------------------------------------------------------------


@pytest.mark.smoke
def test_completions_take_raw_prompts_and_batch_them_with_n(openai_client, model_name):
    response = openai_client.completions.create(
        model=model_name, prompt=["Once upon", "a time"], n=2, max_tokens=3, extra_body=UNTIL_MAX
    )
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in response.choices)
    assert response.usage.completion_tokens == 12
    echoed = openai_client.completions.create(model=model_name, prompt="Once upon", max_tokens=2, echo=True)
    assert echoed.choices[0].text.startswith("Once upon")


def test_completions_stream_with_usage_and_logprobs(openai_client, model_name):
    chunks = list(
        openai_client.completions.create(
            model=model_name,
            prompt="Once upon a time",
            max_tokens=5,
            logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=UNTIL_MAX,
        )
    )
    *content, last = chunks
    assert {c.id for c in chunks} == {chunks[0].id}
    assert last.choices == [] and last.usage.completion_tokens == 5
    assert content[-1].choices[0].finish_reason == "length"
    tokens = [t for c in content for t in (c.choices[0].logprobs.tokens if c.choices[0].logprobs else [])]
    assert len(tokens) == 5


def test_completions_take_token_ids(openai_client, model_name):
    response = openai_client.completions.create(
        model=model_name, prompt=[1, 2, 3, 4], max_tokens=2, extra_body=UNTIL_MAX
    )
    assert response.usage.prompt_tokens == 4


# --- the async client --------------------------------------------------------------------------


async def test_async_client_non_stream(async_openai_client, model_name):
    response = await async_openai_client.chat.completions.create(
        model=model_name, messages=chat(), max_tokens=4, extra_body=UNTIL_MAX
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 4


async def test_async_client_stream_with_usage(async_openai_client, model_name):
    stream = await async_openai_client.chat.completions.create(
        model=model_name,
        messages=chat(),
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=UNTIL_MAX,
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


async def test_async_client_n_2_and_stop(async_openai_client, model_name):
    response = await async_openai_client.chat.completions.create(
        model=model_name, messages=chat(), n=2, max_tokens=4, stop=["\u2603"], extra_body=UNTIL_MAX
    )
    assert [c.index for c in response.choices] == [0, 1]


async def test_async_client_seed_reproducibility(async_openai_client, model_name):
    async def sample() -> str:
        r = await async_openai_client.chat.completions.create(
            model=model_name, messages=chat(), max_tokens=10, seed=99, temperature=1.0, extra_body=UNTIL_MAX
        )
        return r.choices[0].message.content

    first, second = await asyncio.gather(sample(), sample())  # batched together, same seed
    assert first == second
