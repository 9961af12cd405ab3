"""Structured outputs and tools through the official openai client, on a live site with a
random-weight model: whatever it samples, the grammar keeps the output valid."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.api.conftest import chat

pytestmark = pytest.mark.timeout(180)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "now",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool


def _parse(client):
    completions = client.chat.completions
    return completions.parse if hasattr(completions, "parse") else client.beta.chat.completions.parse


@pytest.mark.smoke
def test_parse_with_a_pydantic_model(openai_client, model_name):
    response = _parse(openai_client)(
        model=model_name, messages=chat("A pet, please."), response_format=Pet, max_tokens=120, seed=1
    )
    [choice] = response.choices
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Pet)


def test_json_object_and_guided_fields(openai_client, model_name):
    def content(**kw) -> str:
        response = openai_client.chat.completions.create(
            model=model_name, messages=chat("Answer."), max_tokens=60, seed=3, **kw
        )
        assert response.choices[0].finish_reason == "stop", response
        return response.choices[0].message.content

    # Any object: random weights may write keys until max_tokens, but always inside one.
    response = openai_client.chat.completions.create(
        model=model_name,
        messages=chat("Answer."),
        max_tokens=60,
        seed=3,
        response_format={"type": "json_object"},
    )
    text = response.choices[0].message.content
    assert text.startswith("{")
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    assert re.fullmatch(r"[a-c]{2,5}-\d", content(extra_body={"guided_regex": r"[a-c]{2,5}-\d"}))
    assert content(extra_body={"guided_choice": ["yes", "no"]}) in ("yes", "no")
    assert content(extra_body={"structured_outputs": {"choice": ["left", "right"]}}) in ("left", "right")
    grammar = 'root ::= "(" num ("+" num)? ")"\nnum ::= [1-9]'
    assert re.fullmatch(r"\([1-9](\+[1-9])?\)", content(extra_body={"guided_grammar": grammar}))
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
    assert isinstance(json.loads(content(extra_body={"guided_json": schema}))["x"], bool)


def test_text_completions_take_guided_fields(openai_client, model_name):
    response = openai_client.completions.create(
        model=model_name, prompt="Pick:", max_tokens=10, extra_body={"guided_choice": ["red", "blue"]}
    )
    assert response.choices[0].text in ("red", "blue")


def _check_call(call) -> None:
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_and_named_tool_choice(openai_client, model_name):
    for choice, names in [
        ("required", {"get_weather", "now"}),
        ({"type": "function", "function": {"name": "now"}}, {"now"}),
    ]:
        response = openai_client.chat.completions.create(
            model=model_name,
            messages=chat("Weather in Oslo?"),
            tools=[WEATHER, CLOCK],
            tool_choice=choice,
            parallel_tool_calls=False,  # random weights could otherwise call until max_tokens
            max_tokens=120,
            seed=5,
        )
        [c] = response.choices
        assert c.finish_reason == "tool_calls", c
        assert c.message.tool_calls and not c.message.content
        for call in c.message.tool_calls:
            assert call.function.name in names
            _check_call(call)


def test_parallel_tool_calls_false_gives_one_call(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name,
        messages=chat("Both tools, please."),
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        seed=6,
    )
    assert len(response.choices[0].message.tool_calls) == 1


def test_auto_tool_choice_gives_text_or_valid_calls(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=chat("Weather?"), tools=[WEATHER], max_tokens=40, seed=7
    )
    message = response.choices[0].message
    for call in message.tool_calls or []:
        _check_call(call)
    assert message.tool_calls or isinstance(message.content, str)


def test_streamed_tool_calls_reassemble(openai_client, model_name):
    stream = openai_client.chat.completions.create(
        model=model_name,
        messages=chat("Weather in Oslo and the time?"),
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        seed=8,
        stream=True,
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                if part.index not in calls:  # the first piece of a call: id, type, name, empty arguments
                    assert part.id and part.type == "function" and part.function.name
                    assert part.function.arguments == ""
                    calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
                else:
                    assert part.id is None and part.function.name is None
                    calls[part.index]["arguments"] += part.function.arguments
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert calls and sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])


def test_tool_round_trip(openai_client, model_name):
    first = openai_client.chat.completions.create(
        model=model_name,
        messages=chat("Weather?"),
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
    )
    message = first.choices[0].message
    assert message.tool_calls, (message.content, first.choices[0].finish_reason, first.usage)
    messages = [
        *chat("Weather?"),
        message.model_dump(exclude_none=True),
        *[{"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C"} for c in message.tool_calls],
    ]
    answer = openai_client.chat.completions.create(
        model=model_name, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8, temperature=0
    )
    [choice] = answer.choices
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    # The call and its result are in the prompt (under "none" the tools themselves are not).
    alone = openai_client.chat.completions.create(
        model=model_name, messages=chat("Weather?"), tools=[WEATHER], tool_choice="none", max_tokens=1
    )
    call_tokens = len(message.tool_calls[0].function.arguments) // 4
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + call_tokens


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"extra_body": {"guided_json": {"properties": {"a": {"$ref": "#/missing"}}}}}, "guided_json"),
        ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
        ({"extra_body": {"guided_grammar": "root ::= nowhere"}}, "guided_grammar"),
        ({"extra_body": {"guided_choice": []}}, "guided_choice"),
        ({"extra_body": {"structured_outputs": {"xml": "x"}}}, "structured_outputs"),
        ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_regex"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools[0].function.parameters",
        ),
    ],
)
def test_bad_structured_inputs_are_400(openai_client, model_name, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=model_name, messages=chat(), max_tokens=2, **fields)
    error = info.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def _result(response) -> dict:
    [choice] = response.choices
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return {"content": choice.message.content or "", "calls": calls, "finish_reason": choice.finish_reason}


def _streamed_result(stream) -> dict:
    content, calls, finish = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                if part.index not in calls:
                    calls[part.index] = [part.function.name, ""]
                calls[part.index][1] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return {"content": content, "calls": [tuple(c) for c in calls.values()], "finish_reason": finish}


@pytest.mark.parametrize("max_tokens", [3, 9, 25])
def test_a_call_cut_by_max_tokens_is_the_same_streamed_or_not(openai_client, model_name, max_tokens):
    """Cut in the head (no call, no markup) or in the arguments (a call with what it got, as
    OpenAI returns it): the streamed answer says the same as the whole one."""
    fields = dict(
        model=model_name,
        messages=chat("Weather in Oslo?"),
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
    )
    whole = _result(openai_client.chat.completions.create(**fields))
    streamed = _streamed_result(openai_client.chat.completions.create(**fields, stream=True))
    assert whole == streamed
    assert whole["finish_reason"] == "length" and whole["content"] == ""


def test_parallel_required_calls_end_cleanly(openai_client, model_name):
    """Parallel calls allowed under "required": the list ends (its own end, a repeated call or
    the cap on calls) before max_tokens, with no markup left in the content."""
    response = openai_client.chat.completions.create(
        model=model_name,
        messages=chat("Weather in Oslo and the time?"),
        tools=[CLOCK],
        tool_choice="required",
        max_tokens=600,
        temperature=0,
    )
    result = _result(response)
    assert result["finish_reason"] == "tool_calls", result
    assert result["content"] == "" and 1 <= len(result["calls"]) <= 8
    assert len(set(result["calls"])) == len(result["calls"])  # no call twice
