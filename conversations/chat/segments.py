"""Per-message prompt ids with a bounded number of template renders.

``Tokenizer.encode_chat_segments`` finds message i's segment as the template's text for
``messages[:i+1]`` minus its text for ``messages[:i]``: every prefix is rendered, so a
history of n messages costs O(n²). :func:`encode_segments` gives the same ids from a
fixed number of renders of the whole list (O(n)):

- the list is rendered once with each content replaced by a unique marker; where the
  markers land splits the text into each message's header, content and tail;
- the real render must equal that text with the contents put back (the template copies
  contents verbatim), and must start with the render of all but the last message (the
  prefix property the prefix cache relies on);
- a message's segment ends after its content plus the tail its role gets when it is the
  last message (read once per role, from the first message of that role), which is where
  the render of the list up to it ends.

A template that fails any check gets the quadratic path, which is exact for every template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.tokenizer import ChatEncoding

_MARK = "\u2063CHATSITE-SEGMENT-"


def _marker(index: int) -> str:
    return f"{_MARK}{index}\u2063"


@dataclass
class _Layout:
    text: str  # the template's render of the messages, without a generation prompt
    bounds: list[int]  # message i's segment is text[bounds[i]:bounds[i + 1]]
    content_spans: list[tuple[int, int]]  # where each message's content lies in text


def encode_segments(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> ChatEncoding:
    """What ``tokenizer.encode_chat_segments(messages, add_generation_prompt)`` returns,
    in time linear in the number of messages for templates that render contents verbatim
    and keep earlier turns as they were."""
    layout = _layout(tokenizer, messages)
    if layout is None:
        if messages and not _prefix_holds(tokenizer, messages, _render(tokenizer, messages)):
            # The template rewrites earlier turns: the exact path would find the same after
            # rendering every prefix; go straight to its answer, the whole render.
            whole = tokenizer.apply_chat_template(messages, add_generation_prompt)
            return ChatEncoding(segments=[tokenizer.encode(whole)], exact=False)
        return tokenizer.encode_chat_segments(messages, add_generation_prompt)
    encoded: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in encoded:  # headers and tails repeat: tokenise each once
            encoded[text] = tokenizer.encode(text)
        return encoded[text]

    result = ChatEncoding()
    for i, message in enumerate(messages):
        start, end = layout.bounds[i], layout.bounds[i + 1]
        stored = message.get("token_ids")
        if stored is None:
            result.segments.append(tokenizer.encode(layout.text[start:end]))
        elif message["role"] == "assistant":
            first, last = layout.content_spans[i]
            header, tail = layout.text[start:first], layout.text[last:end]
            result.segments.append(_assistant_segment(tokenizer, encode, header, tail, list(stored)))
        else:
            result.segments.append([int(t) for t in stored])
    if add_generation_prompt:
        full = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        result.generation_prompt = tokenizer.encode(full[len(layout.text) :])
    return result


def _assistant_segment(
    tokenizer: Any, encode: Any, header: str, tail: str, generated: list[int]
) -> list[int]:
    """Header + generated ids + the template's tail, as ``Tokenizer._assistant_segment``
    builds it: an end-of-turn token the model generated is not written twice."""
    if generated and generated[-1] in tokenizer.eos_token_ids:
        end_text = tokenizer.hf.convert_ids_to_tokens(generated[-1])
        if tail.startswith(end_text):
            tail = tail[len(end_text) :]
    return encode(header) + generated + (encode(tail) if tail else [])


def _render(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=False)


def _prefix_holds(tokenizer: Any, messages: Sequence[Mapping[str, Any]], text: str) -> bool:
    """Whether the render without the last message is where ``text`` starts."""
    return text.startswith(_render(tokenizer, messages[:-1]))


def _layout(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> _Layout | None:
    """Each message's segment in the render of ``messages``, or None where the checks in
    the module's docstring fail."""
    if not messages or any(_MARK in str(m["content"]) for m in messages):
        return None
    probe = [{"role": m["role"], "content": _marker(i)} for i, m in enumerate(messages)]
    marked = _render(tokenizer, probe)
    if marked.count(_MARK) != len(messages):
        return None
    glue, cursor = [], 0
    for i in range(len(messages)):
        at = marked.find(_marker(i), cursor)
        if at < 0:
            return None
        glue.append(marked[cursor:at])
        cursor = at + len(_marker(i))
    glue.append(marked[cursor:])
    text = _render(tokenizer, messages)
    tails = _tails(tokenizer, probe)
    contents = [str(m["content"]) for m in messages]
    rebuilt = "".join(g + c for g, c in zip(glue, [*contents, ""], strict=True))
    if tails is None or rebuilt != text:
        return None
    bounds, spans, position = [0], [], 0
    for i, (message, content) in enumerate(zip(messages, contents, strict=True)):
        position += len(glue[i])
        spans.append((position, position + len(content)))
        position += len(content)
        tail = tails[message["role"]]
        if not glue[i + 1].startswith(tail) or (i + 1 == len(messages) and glue[i + 1] != tail):
            return None
        bounds.append(position + len(tail))
    # The previous turn's prompt is where this one starts, and ends where its segments do.
    before = _render(tokenizer, messages[:-1])
    if not text.startswith(before) or len(before) != bounds[-2]:
        return None
    return _Layout(text=text, bounds=bounds, content_spans=spans)


def _tails(tokenizer: Any, probe: list[dict]) -> dict[str, str] | None:
    """For each role, what the template writes after a content of that role when it is
    the last message (read at the first message of the role); None if it hides one."""
    tails: dict[str, str] = {}
    for i, message in enumerate(probe):
        if message["role"] not in tails:
            parts = _render(tokenizer, probe[: i + 1]).split(message["content"])
            if len(parts) != 2:
                return None
            tails[message["role"]] = parts[1]
    return tails
