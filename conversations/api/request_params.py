"""From an API request body to the engine's sampling parameters, and the 400s that name its
fields: invalid parameters, a prompt token outside the vocabulary, a prompt or completion
past the model's context window (in OpenAI's words, so clients that parse them keep working)."""

from __future__ import annotations

from typing import Any

from conversations.api.errors import ApiError, invalid

# Engine option names back to the API's, for the ``param`` of a 400.
_ENGINE_FIELD_TO_PARAM = {"beam_width": "n", "best_of": "n"}


def logit_bias_of(body: Any, vocab_size: int) -> dict[int, float] | None:
    """``logit_bias`` as token id -> bias; a 400 for a key that is not a token id of the
    model's vocabulary or a bias outside [-100, 100] (OpenAI's bounds)."""
    from inference.sampling.params import LOGIT_BIAS_BOUND

    raw = getattr(body, "logit_bias", None)
    if not raw:
        return None
    bias: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid(f"logit_bias key {key!r} is not a token id.", param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise invalid(
                f"logit_bias token id {token} is out of the vocabulary (size {vocab_size}).",
                param="logit_bias",
            )
        if not (-LOGIT_BIAS_BOUND <= value <= LOGIT_BIAS_BOUND):  # NaN fails too
            raise invalid(
                f"logit_bias value {value} for token {token} is outside [-100, 100].", param="logit_bias"
            )
        bias[token] = float(value)
    return bias


def sampling_params(
    body: Any,
    max_tokens: int | None,
    logprobs: int | None,
    *,
    chat: bool = False,
    vocab_size: int = 0,
    prompt_logprobs: int | None = None,
):
    """The engine's ``SamplingParams`` for a request body; a 400 naming the field if invalid.
    Chat separates a reasoning model's ``<think>`` text (``reasoning_content``).
    ``vocab_size`` bounds ``logit_bias``'s token ids; ``prompt_logprobs``: an echo's."""
    from inference.sampling.params import SamplingParams

    kwargs: dict[str, Any] = {
        "n": body.n or 1,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": body.top_k or 0,
        "min_p": body.min_p or 0.0,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "max_tokens": max_tokens,
        "ignore_eos": bool(body.ignore_eos),
        "stop": body.stop,
        "seed": body.seed,
        "logprobs": logprobs,
        "use_beam_search": bool(body.use_beam_search),
        "length_penalty": 1.0 if body.length_penalty is None else body.length_penalty,
        "separate_reasoning": chat,
        "min_tokens": body.min_tokens or 0,
        "logit_bias": logit_bias_of(body, vocab_size),
        "prompt_logprobs": prompt_logprobs,
    }
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        raise invalid(str(exc), param=param_from_message(str(exc))) from exc


def param_from_message(message: str) -> str | None:
    word = message.split(" ", 1)[0].strip(":")
    if not word.isidentifier():
        return None
    return _ENGINE_FIELD_TO_PARAM.get(word, word)


def check_context(engine: Any, prompts: list[list[int]], max_tokens: int | None, param: str) -> None:
    """OpenAI's context-window errors, before the engine sees the request."""
    limit = engine.max_model_len
    where = "messages" if param == "messages" else "prompt"
    for ids in prompts:
        if not ids:
            raise invalid(f"The {where} is empty: it has no tokens.", param=param)
        if len(ids) >= limit:
            raise prompt_too_long(len(ids), limit - 1, limit, param)
        if max_tokens is not None and len(ids) + max_tokens > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the {where}, {max_tokens} in the "
                f"completion). Please reduce the length of the {where} or completion.",
                param="max_tokens",
                code="context_length_exceeded",
            )


def prompt_too_long(num_tokens: int, prompt_limit: int, max_model_len: int, param: str) -> ApiError:
    where = "messages" if param == "messages" else "prompt"
    return invalid(
        f"This model's maximum context length is {max_model_len} tokens, so a prompt may have at "
        f"most {prompt_limit} tokens. However, your {where} resulted in {num_tokens} tokens. "
        f"Please reduce the length of the {where}.",
        param=param,
        code="context_length_exceeded",
    )


def invalid_prompt_token(token_id: int, vocab_size: int, param: str) -> ApiError:
    """A prompt token id the model has no embedding for (the engine's ``InvalidPromptError``),
    in the words of the API's own check of token-id prompts."""
    return invalid(f"Token id {token_id} is out of the vocabulary (size {vocab_size}).", param=param)
