"""The popular client libraries against the live server, end to end: openai-agents (an
Agent with a tool and an ``output_type``, streamed and not), pydantic-ai (a tool and
``NativeOutput``), langchain-openai and litellm. The model is the tiny random Llama of the
live server, so what is checked is the protocol: each library accepts the answers and
gets typed results back, never what the model says.

Output types are enums (``Literal``): a random model fills a free string until
``max_tokens``, which no JSON answer survives."""

from __future__ import annotations

import os
from typing import Literal

import pytest
from pydantic import BaseModel

# litellm fetches a price list from the network at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MAX_TOKENS = 96
City = Literal["Paris", "Rome", "Oslo", "Lima"]


class Weather(BaseModel):
    sky: Literal["sunny", "rainy"]


def get_weather(city: City) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture
def base_url(live_site) -> str:
    return f"{live_site.url}/v1"


# --- openai-agents ------------------------------------------------------------------------


@pytest.fixture
def agents_agent(base_url, api_key, model_name):
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # traces would go to OpenAI's servers
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    model = agents.OpenAIChatCompletionsModel(model=model_name, openai_client=client)
    calls: list[str] = []

    @agents.function_tool
    def weather(city: City) -> str:
        """The weather in a city."""
        calls.append(city)
        return get_weather(city)

    agent = agents.Agent(
        name="forecaster",
        instructions="Answer with the sky over the city.",
        tools=[weather],
        output_type=Weather,
        model=model,
        model_settings=agents.ModelSettings(max_tokens=MAX_TOKENS, temperature=0),
    )
    return agent, calls


async def test_openai_agents_agent_with_tool_and_output_type(agents_agent):
    import agents

    agent, calls = agents_agent
    result = await agents.Runner.run(agent, "Weather in Paris?", max_turns=6)
    assert isinstance(result.final_output, Weather)
    # Every tool call the model made ran, and each came back to the model as a result.
    outputs = [i for i in result.new_items if isinstance(i, agents.ToolCallOutputItem)]
    assert len(outputs) == len(calls)


async def test_openai_agents_agent_streamed(agents_agent):
    import agents

    agent, calls = agents_agent
    result = agents.Runner.run_streamed(agent, "Weather in Rome?", max_turns=6)
    kinds = set()
    async for event in result.stream_events():
        kinds.add(event.type)
    assert isinstance(result.final_output, Weather)
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds


async def test_openai_agents_required_tool_then_output(agents_agent):
    """``tool_choice: required`` on the first turn: the tool runs, then (tool choice reset,
    the SDK's default) the answer comes in the output type."""
    import agents

    agent, calls = agents_agent
    agent = agent.clone(
        model_settings=agents.ModelSettings(max_tokens=MAX_TOKENS, temperature=0, tool_choice="required")
    )
    result = await agents.Runner.run(agent, "Weather in Oslo?", max_turns=6)
    assert calls and isinstance(result.final_output, Weather)


# --- pydantic-ai ----------------------------------------------------------------------------


@pytest.fixture
def pydantic_agent(base_url, api_key, model_name):
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key=api_key))
    agent = Agent(
        model,
        output_type=NativeOutput(Weather),
        model_settings={"max_tokens": MAX_TOKENS, "temperature": 0},
        retries=2,
    )
    agent.tool_plain(get_weather)
    return agent


async def test_pydantic_ai_tool_with_native_output(pydantic_agent):
    result = await pydantic_agent.run("Weather in Paris?")
    assert isinstance(result.output, Weather)


async def test_pydantic_ai_streamed_native_output(pydantic_agent):
    async with pydantic_agent.run_stream("Weather in Lima?") as run:
        output = await run.get_output()
    assert isinstance(output, Weather)


# --- langchain-openai -------------------------------------------------------------------------


@pytest.fixture
def chat_model(base_url, api_key, model_name):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=model_name,
        base_url=base_url,
        api_key=api_key,
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
    )


def test_langchain_invoke_stream_and_structured_output(chat_model):
    reply = chat_model.invoke("Say hello.")
    assert reply.content and reply.usage_metadata["output_tokens"] > 0
    streamed = "".join(chunk.content for chunk in chat_model.stream("Say hello."))
    assert streamed == reply.content  # greedy: the same answer
    # json_mode is left out: a free JSON object, which a random model never closes.
    for method in ("json_schema", "function_calling"):
        assert isinstance(
            chat_model.with_structured_output(Weather, method=method).invoke("Weather?"), Weather
        )


def test_langchain_tools_with_structured_output_and_round_trip(chat_model):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    weather = tool(get_weather)
    forced = chat_model.bind_tools([weather], tool_choice="get_weather")
    message = forced.invoke([HumanMessage("Weather in Paris?")])
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    call = message.tool_calls[0]
    result = weather.invoke(call["args"])
    follow = chat_model.bind_tools([weather]).invoke(
        [HumanMessage("Weather in Paris?"), message, ToolMessage(result, tool_call_id=call["id"])]
    )
    assert follow.content or follow.tool_calls
    # Tools and a response format on one request (what agent frameworks send).
    both = chat_model.bind_tools([weather], response_format=Weather, strict=True).invoke("Weather in Paris?")
    assert both.tool_calls or Weather.model_validate_json(both.content)


def test_langchain_embeddings(base_url, api_key, model_name):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length would count tokens with tiktoken's OpenAI vocabularies.
    embeddings = OpenAIEmbeddings(
        model=model_name, base_url=base_url, api_key=api_key, check_embedding_ctx_length=False, max_retries=0
    )
    vectors = embeddings.embed_documents(["a cat", "a dog"])
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0


# --- litellm ---------------------------------------------------------------------------------


def test_litellm_chat_stream_tools_and_response_format(base_url, api_key, model_name):
    import litellm

    common = {
        "model": f"openai/{model_name}",
        "api_base": base_url,
        "api_key": api_key,
        "max_tokens": MAX_TOKENS,
    }
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = litellm.completion(messages=messages, temperature=0, **common)
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens > 0
    chunks = list(litellm.completion(messages=messages, temperature=0, stream=True, **common))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                "required": ["city"],
            },
        },
    }
    called = litellm.completion(
        messages=messages,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **common,
    )
    assert called.choices[0].message.tool_calls[0].function.name == "get_weather"
    both = litellm.completion(
        messages=messages, tools=[tool], response_format=Weather, temperature=0, **common
    )
    message = both.choices[0].message
    assert message.tool_calls or Weather.model_validate_json(message.content)
    text = litellm.text_completion(prompt="Once upon a time", **common)
    assert text.choices[0].text is not None
