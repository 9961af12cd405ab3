"""Typed request and response bodies of the OpenAI-compatible API.

Requests follow OpenAI's field names, plus vLLM's sampling extensions. Unknown fields
are ignored (as OpenAI and vLLM do), so newer clients keep working. Bounds live here,
so they also appear in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 16  # completions per request (OpenAI allows 128; one engine's batch is smaller)
MAX_TOP_LOGPROBS = 20
# Stop strings: the engine's caps (OpenAI's four), in the schema so they show in the OpenAPI document.
# The engine's caps (inference.sampling.params), repeated here so that importing the API's
# schemas (a Celery worker does) loads no engine code; a test keeps the two equal.
MAX_STOP = 4
MAX_STOP_CHARS = 1024

NonEmptyStr = Annotated[str, Field(min_length=1)]
StopStr = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class RequestSchema(Schema):
    model_config = ConfigDict(extra="ignore")


class TextPart(RequestSchema):
    type: Literal["text"]
    text: str


class FunctionCallIn(RequestSchema):
    name: NonEmptyStr
    arguments: str = "{}"  # JSON text of an object, as OpenAI sends it


class ToolCallIn(RequestSchema):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(RequestSchema):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant: the calls it made
    function_call: FunctionCallIn | None = None  # assistant, deprecated form: its one call
    tool_call_id: str | None = None  # tool: the call this message answers


class FunctionSpec(RequestSchema):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict | None = Field(None, description="A JSON schema of the arguments object.")
    strict: bool | None = None


class ToolSpec(RequestSchema):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(RequestSchema):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = Field(
        False, description="vLLM extension: every chunk carries the usage so far."
    )


class SamplingFields(RequestSchema):
    """Fields shared by chat and text completions."""

    model: str = Field(description="The served model's id, as GET /v1/models lists it.")
    n: int | None = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy. Default 1.")
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, description="Default: what the context window leaves.")
    stop: StopStr | Annotated[list[StopStr], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    stream: bool | None = False
    stream_options: StreamOptions | None = Field(None, description="Only with `stream: true`.")
    user: str | None = None
    logit_bias: dict[str, float] | None = Field(
        None,
        description="Token id (as a string) -> bias in [-100, 100] added to its logit before sampling.",
    )
    # vLLM extensions.
    top_k: int | None = Field(None, ge=-1, description="vLLM extension: -1 or 0 disables it.")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension.")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="vLLM extension.")
    ignore_eos: bool | None = Field(False, description="vLLM extension.")
    min_tokens: int | None = Field(
        None, ge=0, description="vLLM extension: EOS and stop sequences are held back until this many tokens."
    )
    use_beam_search: bool | None = Field(False, description="vLLM extension.")
    length_penalty: float | None = Field(1.0, ge=-10, le=10, description="vLLM extension (beam search).")
    # vLLM's guided decoding (one of them, or response_format, per request).
    guided_json: dict | str | None = Field(
        None, description="vLLM extension: a JSON schema the output follows."
    )
    guided_regex: str | None = Field(None, description="vLLM extension: a regex the output matches.")
    guided_choice: list[str] | None = Field(None, description="vLLM extension: the output is one of these.")
    guided_grammar: str | None = Field(
        None, description="vLLM extension: an EBNF/GBNF grammar (rule `root`)."
    )
    structured_outputs: dict | None = Field(
        None, description="vLLM extension: one of `json`, `regex`, `choice`, `grammar`."
    )
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vLLM extension: prefix-cache blocks are shared only between requests with the same "
        "salt from the same account (the salt is nested inside the key owner's own cache, so it never "
        "matches another account's requests, whatever salt they use). Without it a request shares the "
        "cache of its owner's other requests and chats, never another account's.",
    )


class ChatCompletionRequest(SamplingFields):
    # The example is shown in /v1/docs and sent as is by schemathesis' examples phase.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "model": "SmolLM2-135M-Instruct",
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 4,
                    "temperature": 0,
                }
            ]
        },
    )
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Preferred over max_tokens.")
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[ToolSpec], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None
    # Deprecated by OpenAI, still sent by older clients: mapped to tools / tool_choice, and
    # the call answered as ``function_call`` (conversations.api.legacy_functions).
    functions: Annotated[list[FunctionSpec], Field(max_length=128)] | None = None
    function_call: Literal["none", "auto"] | dict | None = None
    response_format: dict | None = Field(
        None, description="`text`, `json_object` or `json_schema` (`{json_schema: {name, schema, strict}}`)."
    )


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [{"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": 4}]
        },
    )
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_N)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_N),
        ]
    )
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = Field(
        False, description="The prompt comes first in the text (with `logprobs`: its tokens' logprobs too)."
    )
    max_tokens: int | None = Field(
        None, ge=0, description="Default: what the context window leaves. 0 with `echo`: score the prompt."
    )


# --- Responses (documentation; the views build these bodies directly) -----------------


class ErrorDetail(Schema):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Schema):
    error: ErrorDetail


class ModelCard(Schema):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # vLLM's fields: the weights' path, an adapter's base model (None for a base model),
    # and the context served (None while a model that loads on first use is not loaded).
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(Schema):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class PromptTokensDetails(Schema):
    cached_tokens: int


class Usage(Schema):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Schema):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Schema):
    content: list[TokenLogprob] | None = None


class FunctionCallOut(Schema):
    name: str
    arguments: str


class ToolCallOut(Schema):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(Schema):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    function_call: FunctionCallOut | None = None  # a request that sent the deprecated ``functions``
    # A reasoning model's thinking (DeepSeek's field); not sent back to the model when a
    # client returns it in later messages (unknown message fields are ignored).
    reasoning_content: str | None = None


class ChatChoice(Schema):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "function_call"] | None = None


class ChatCompletion(Schema):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(Schema):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Schema):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(Schema):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None
