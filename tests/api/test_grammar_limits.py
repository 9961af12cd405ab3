"""Grammar requests over the caps are clear 400s on the live site before anything compiles
(repetition counts, schema size, stop strings), and checking a large schema leaves the
event loop free."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import openai
import pytest
from django.test import override_settings

from conversations.api import schemas
from conversations.api.output_rules import chat_outputs
from tests.api.conftest import chat

pytestmark = pytest.mark.timeout(300)


def bad_request(openai_client, model_name, **fields) -> dict:
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=model_name, messages=chat(), max_tokens=2, **fields)
    assert time.monotonic() - started < 5  # refused up front, not after a compile's time limit
    return info.value.response.json()["error"]


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"extra_body": {"guided_regex": "^a{30000}$"}}, "guided_regex", "repetition_too_large"),
        ({"extra_body": {"guided_regex": "^b{2,30000}$"}}, "guided_regex", "repetition_too_large"),
        ({"extra_body": {"guided_grammar": 'root ::= "a"{30000}'}}, "guided_grammar", "repetition_too_large"),
        (
            {
                "extra_body": {
                    "guided_json": {"type": "object", "properties": {"s": {"pattern": "^x{5000}$"}}}
                }
            },
            "guided_json",
            "repetition_too_large",
        ),
        (
            {"extra_body": {"guided_json": {"type": "object", "patternProperties": {"^k{9999}$": {}}}}},
            "guided_json",
            "repetition_too_large",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "big",
                        "schema": {
                            "type": "object",
                            "properties": {
                                f"p{i}": {"type": "string", "pattern": "^[a-z]+$"} for i in range(3000)
                            },
                        },
                    },
                }
            },
            "response_format.json_schema.schema",
            "schema_too_large",
        ),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", None),
        ({"stop": ["z" * 5000]}, "stop", None),
    ],
)
def test_requests_over_the_caps_are_400(openai_client, model_name, fields, param, code):
    error = bad_request(openai_client, model_name, **fields)
    assert error["type"] == "invalid_request_error", error
    assert error["param"].startswith(param), error  # stop[0]: the item over the cap
    if code is not None:
        assert error["code"] == code, error
    assert len(error["message"]) < 300  # names the limit; does not echo the input


def test_a_pattern_within_the_cap_still_works(openai_client, model_name):
    reply = openai_client.chat.completions.create(
        model=model_name, messages=chat(), max_tokens=8, extra_body={"guided_regex": "^q{3}$"}
    )
    assert reply.choices[0].message.content == "qqq"


def _big_schema_body(properties: int) -> schemas.ChatCompletionRequest:
    schema = {
        "type": "object",
        "properties": {
            f"field_{i}": {"type": "string", "pattern": f"^[a-z]{{1,{i % 50 + 1}}}$", "maxLength": 40}
            for i in range(properties)
        },
    }
    return schemas.ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": schema}},
    )


@override_settings(API_GRAMMAR_MAX_SCHEMA_BYTES=10_000_000)
async def test_validating_a_big_schema_leaves_the_event_loop_free():
    """A ticker on the loop, every 5 ms, while a schema of thousands of patterned properties
    is checked: its longest gap must be a small part of the check's time (on the loop, the
    gap was the whole check)."""
    compiled = []
    engine = SimpleNamespace(
        tokenizer=None,
        grammars=SimpleNamespace(compile=lambda spec, timeout, owner=None: compiled.append(spec)),
    )
    body = _big_schema_body(6000)
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    outputs = await chat_outputs(engine, body, [{"role": "user", "content": "hi"}])
    took = time.monotonic() - started
    done.set()
    await ticker
    assert outputs.grammar is not None and compiled == [outputs.grammar]
    assert took > 0.3, f"the check took only {took:.2f} s: too small to show anything"
    assert max(gaps) < took / 4, f"the loop stalled {max(gaps):.2f} s of a {took:.2f} s check"
