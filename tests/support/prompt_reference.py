"""The definition the prompt encoder is held to, computed the slow way: message i's segment
is the template's render of ``messages[:i+1]`` minus its render of ``messages[:i]``, every
prefix rendered (O(n²) for n messages). Tests compare ``inference.prompt`` with it, and the
prompt benchmarks time it as the way prompts were once built."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference.prompt import ChatEncoding
from inference.tokenizer import Tokenizer

_SENTINEL = "\u2063REFERENCE-CONTENT\u2063"


def per_prefix_segments(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> ChatEncoding:
    result = ChatEncoding()
    render = tokenizer.apply_chat_template
    rendered = [render(messages[:i], add_generation_prompt=False) for i in range(len(messages) + 1)]
    if not all(rendered[i + 1].startswith(rendered[i]) for i in range(len(messages))):
        result.exact = False
        result.segments = [tokenizer.encode(render(messages, add_generation_prompt))]
        return result
    for i, message in enumerate(messages):
        stored = message.get("token_ids")
        if stored is None:
            result.segments.append(tokenizer.encode(rendered[i + 1][len(rendered[i]) :]))
        elif message["role"] == "assistant":
            result.segments.append(_answer(tokenizer, messages[:i], rendered[i], list(stored)))
        else:
            result.segments.append([int(t) for t in stored])
    if add_generation_prompt:
        result.generation_prompt = tokenizer.encode(render(messages, True)[len(rendered[-1]) :])
    return result


def _answer(
    tokenizer: Tokenizer, history: Sequence[Mapping[str, Any]], before: str, ids: list[int]
) -> list[int]:
    probe = [*history, {"role": "assistant", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(probe, add_generation_prompt=False)[len(before) :]
    if _SENTINEL not in text:
        return ids
    header, tail = text.split(_SENTINEL, 1)
    if ids and ids[-1] in tokenizer.eos_token_ids:
        end_text = tokenizer.token_text(ids[-1])
        if tail.startswith(end_text):
            tail = tail[len(end_text) :]
    return tokenizer.encode(header) + ids + (tokenizer.encode(tail) if tail else [])
