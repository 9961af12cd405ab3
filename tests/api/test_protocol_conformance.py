"""Raw protocol probes against the live server, written from OpenAI's API reference and
vLLM's documented behaviour (not from our implementation): tools with an output format,
logit_bias, min_tokens, the deprecated functions, echo with logprobs, max_tokens 0,
completions' top_logprobs and stream_options. The model is the tiny random Llama the
live server runs; where a probe needs the model's own numbers it asks HF transformers on
the same weights."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch

from tests.api.conftest import chat, parse_sse

GREEDY = {"temperature": 0}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 8}},
    "required": ["answer"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "Answer", "schema": ANSWER_SCHEMA, "strict": True},
}


@pytest.fixture
def post(live_site, api_key, model_name):
    def send(path: str, body: dict, stream: bool = False) -> httpx.Response:
        return httpx.post(
            f"{live_site.url}/v1/{path}",
            json={"model": model_name, **body},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=60,
        )

    return send


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def bad_request(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"]
    return error


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


# --- tools together with response_format ---------------------------------------------------


def _call_or_answer(message: dict) -> str:
    """'call' for a well-formed get_weather call, 'answer' for content valid against the schema."""
    if message.get("tool_calls"):
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_TOOL["function"]["parameters"])
        return "call"
    jsonschema.validate(json.loads(message["content"]), ANSWER_SCHEMA)
    return "answer"


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_tools_with_response_format_auto_gives_a_call_or_the_schema(post, seed):
    body = ok(
        post(
            "chat/completions",
            {
                "messages": chat("Weather in Paris? Answer in JSON."),
                "tools": [WEATHER_TOOL],
                "response_format": RESPONSE_FORMAT,
                "max_tokens": 60,
                "seed": seed,
            },
        )
    )
    choice = body["choices"][0]
    kind = _call_or_answer(choice["message"])
    assert choice["finish_reason"] == ("tool_calls" if kind == "call" else "stop")


def test_tools_with_response_format_required_the_tool_wins(post):
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        body = ok(
            post(
                "chat/completions",
                {
                    "messages": chat("Weather in Paris?"),
                    "tools": [WEATHER_TOOL],
                    "tool_choice": tool_choice,
                    "parallel_tool_calls": False,
                    "response_format": RESPONSE_FORMAT,
                    "max_tokens": 60,
                    **GREEDY,
                },
            )
        )
        choice = body["choices"][0]
        assert _call_or_answer(choice["message"]) == "call"
        assert choice["finish_reason"] == "tool_calls"


def test_tools_with_response_format_streamed_agrees_with_non_streamed(post):
    request = {
        "messages": chat("Weather?"),
        "tools": [WEATHER_TOOL],
        "response_format": RESPONSE_FORMAT,
        "max_tokens": 60,
        **GREEDY,
    }
    whole = ok(post("chat/completions", request))["choices"][0]
    events = parse_sse(post("chat/completions", {**request, "stream": True}).text)
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    calls = [c for e in events if e["choices"] for c in e["choices"][0]["delta"].get("tool_calls") or []]
    finish = [
        e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert finish == [whole["finish_reason"]]
    if whole["message"].get("tool_calls"):
        assert calls and calls[0]["function"]["name"] == "get_weather"
        streamed_arguments = "".join(c["function"].get("arguments", "") for c in calls)
        assert json.loads(streamed_arguments) == json.loads(
            whole["message"]["tool_calls"][0]["function"]["arguments"]
        )
    else:
        assert content == whole["message"]["content"] and not calls


# --- logit_bias and min_tokens --------------------------------------------------------------


def test_logit_bias_bans_tokens_and_forces_one(post, hf_model):
    _, tokenizer = hf_model
    request = {"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True, **GREEDY}
    plain = ok(post("completions", request))["choices"][0]["text"]
    plain_ids = tokenizer.encode(plain)
    banned = ok(post("completions", {**request, "logit_bias": {str(t): -100 for t in plain_ids}}))
    assert not set(tokenizer.encode(banned["choices"][0]["text"])) & set(plain_ids)
    token = tokenizer.encode(" hello")[0]
    forced = ok(post("completions", {**request, "logit_bias": {str(token): 100}, "max_tokens": 3}))
    assert forced["choices"][0]["text"] == tokenizer.decode([token] * 3)


def test_logit_bias_applies_to_chat_too(post, hf_model):
    _, tokenizer = hf_model
    token = tokenizer.encode("yes")[0]
    body = ok(
        post(
            "chat/completions",
            {
                "messages": chat(),
                "max_tokens": 2,
                "logit_bias": {str(token): 100},
                "ignore_eos": True,
                **GREEDY,
            },
        )
    )
    assert body["choices"][0]["message"]["content"] == "yes" * 2


@pytest.mark.parametrize(
    "bias",
    [{"abc": 1}, {"-1": 1}, {"99999999": 1}, {"5": 101}, {"5": -100.5}],
)
def test_bad_logit_bias_is_a_400(post, bias):
    bad_request(post("completions", {"prompt": "Hi", "max_tokens": 1, "logit_bias": bias}), "logit_bias")
    bad_request(
        post("chat/completions", {"messages": chat(), "max_tokens": 1, "logit_bias": bias}), "logit_bias"
    )


def test_min_tokens_holds_back_eos(post, hf_model):
    _, tokenizer = hf_model
    eos = tokenizer.eos_token_id
    request = {"prompt": "Hi", "max_tokens": 10, "logit_bias": {str(eos): 100}, **GREEDY}
    assert ok(post("completions", request))["usage"]["completion_tokens"] == 1  # EOS at once
    held = ok(post("completions", {**request, "min_tokens": 4}))
    assert held["usage"]["completion_tokens"] == 5 and held["choices"][0]["finish_reason"] == "stop"
    bad_request(post("completions", {**request, "min_tokens": 11}), "min_tokens")


# --- the deprecated functions / function_call -------------------------------------------------


def test_functions_map_to_tools_and_answer_as_function_call(post):
    function = WEATHER_TOOL["function"]
    request = {
        "messages": chat("Weather in Paris?"),
        "functions": [function],
        "function_call": {"name": "get_weather"},
        "max_tokens": 40,
        **GREEDY,
    }
    choice = ok(post("chat/completions", request))["choices"][0]
    assert choice["finish_reason"] == "function_call"
    call = choice["message"]["function_call"]
    assert call["name"] == "get_weather" and "tool_calls" not in choice["message"]
    jsonschema.validate(json.loads(call["arguments"]), function["parameters"])
    events = parse_sse(post("chat/completions", {**request, "stream": True}).text)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    streamed = [d["function_call"] for d in deltas if d.get("function_call")]
    assert streamed[0]["name"] == "get_weather"
    # The same arguments (whitespace between the call head and them is the stream parser's).
    assert json.loads("".join(d.get("arguments", "") for d in streamed)) == json.loads(call["arguments"])
    assert events[-1]["choices"][0]["finish_reason"] == "function_call"
    # The old history shapes: an assistant function_call and a function result.
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    follow = ok(post("chat/completions", {"messages": history, "functions": [function], "max_tokens": 5}))
    assert follow["choices"][0]["finish_reason"] in ("stop", "length", "function_call")
    none = ok(post("chat/completions", {**request, "function_call": "none", "max_tokens": 5}))
    assert (
        "function_call" not in none["choices"][0]["message"]
        or not none["choices"][0]["message"]["function_call"]
    )


# --- echo with logprobs, max_tokens 0 ---------------------------------------------------------


def _hf_prompt_logprobs(hf_model, ids: list[int]) -> list[float]:
    model, _ = hf_model
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logp[p - 1, ids[p]].item() for p in range(1, len(ids))]


def test_echo_with_logprobs_scores_the_prompt_like_hf(post, hf_model):
    _, tokenizer = hf_model
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = tokenizer.encode(prompt)
    body = ok(post("completions", {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 2, **GREEDY}))
    choice = body["choices"][0]
    assert choice["text"].startswith(prompt)
    lp = choice["logprobs"]
    n = len(ids)
    assert (
        len(lp["tokens"])
        == n + 2
        == len(lp["token_logprobs"])
        == len(lp["top_logprobs"])
        == len(lp["text_offset"])
    )
    assert "".join(lp["tokens"][:n]) == prompt
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:n] == pytest.approx(_hf_prompt_logprobs(hf_model, ids), abs=1e-3)
    assert lp["text_offset"][:n] == [len("".join(lp["tokens"][:i])) for i in range(n)]
    for token, value, top in zip(
        lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True
    ):
        assert 1 <= len(top) <= 3 and top[token] == pytest.approx(value)
    assert body["usage"]["prompt_tokens"] == n and body["usage"]["completion_tokens"] == 2


def test_max_tokens_zero_with_echo_scores_without_generating(post, hf_model):
    _, tokenizer = hf_model
    prompt = "Paris is the capital of France"
    ids = tokenizer.encode(prompt)
    body = ok(post("completions", {"prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 0}))
    choice = body["choices"][0]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        _hf_prompt_logprobs(hf_model, ids), abs=1e-3
    )
    assert all(len(t) == 1 for t in choice["logprobs"]["top_logprobs"][1:])  # logprobs 0: the token itself


def test_prompt_logprobs_are_recomputed_for_a_cached_prefix(post):
    """The second request's prompt is in the prefix cache (the first put it there); its
    tokens have no logits there, so they must be recomputed, not reported as missing."""
    prompt = "In the beginning there was a long shared prefix that fills several KV blocks " * 3
    ok(post("completions", {"prompt": prompt, "max_tokens": 1}))
    first = ok(post("completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0}))
    second = ok(post("completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0}))
    a, b = first["choices"][0]["logprobs"], second["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and a["token_logprobs"] == b["token_logprobs"]
    assert None not in a["token_logprobs"][1:]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_echo_logprobs_stream_like_the_whole_response(post):
    request = {"prompt": "One two three four", "echo": True, "logprobs": 1, "max_tokens": 3, **GREEDY}
    whole = ok(post("completions", request))["choices"][0]
    events = parse_sse(post("completions", {**request, "stream": True}).text)
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    tokens = [
        t
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for t in e["choices"][0]["logprobs"]["tokens"]
    ]
    values = [
        v
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for v in e["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert text == whole["text"] and tokens == whole["logprobs"]["tokens"]
    assert values == whole["logprobs"]["token_logprobs"]


def test_max_tokens_zero_is_still_a_400_on_chat(post):
    bad_request(post("chat/completions", {"messages": chat(), "max_tokens": 0}), "max_tokens")


# --- completions' top_logprobs ---------------------------------------------------------------


def test_completion_top_logprobs_include_the_sampled_token(post):
    for k in (0, 1, 3):
        body = ok(
            post(
                "completions",
                {"prompt": "Hello", "max_tokens": 4, "logprobs": k, "temperature": 1.0, "seed": 7},
            )
        )
        lp = body["choices"][0]["logprobs"]
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
            assert token in top and top[token] == pytest.approx(value)
            assert max(1, k) <= len(top) <= k + 1


# --- stream_options ---------------------------------------------------------------------------


def test_stream_options_without_stream_is_a_400(post):
    options = {"stream_options": {"include_usage": True}}
    bad_request(post("chat/completions", {"messages": chat(), "max_tokens": 1, **options}), "stream_options")
    bad_request(
        post("completions", {"prompt": "Hi", "max_tokens": 1, "stream": False, **options}), "stream_options"
    )
    assert ok(post("completions", {"prompt": "Hi", "max_tokens": 1, "stream_options": None}))["choices"]


def test_max_tokens_zero_streams_the_scored_prompt(post):
    request = {"prompt": "Paris is the capital", "echo": True, "logprobs": 1, "max_tokens": 0}
    whole = ok(post("completions", request))["choices"][0]
    events = parse_sse(post("completions", {**request, "stream": True}).text)
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in choices) == whole["text"] == request["prompt"]
    assert [t for c in choices if c["logprobs"] for t in c["logprobs"]["token_logprobs"]] == (
        whole["logprobs"]["token_logprobs"]
    )
    assert choices[-1]["finish_reason"] == "length"
