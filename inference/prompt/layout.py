"""Where each message's segment lies in the template's render of a conversation.

A message's segment is the template's text for ``messages[:i+1]`` minus its text for
``messages[:i]``: what the prompt gains when that message is added, so that turn N+1's
prompt starts with turn N's. Rendering every prefix to find it costs O(n²) for n messages;
:func:`marked_layout` finds the same bounds from a fixed number of renders of the whole list:

- the list is rendered once with each content replaced by a unique marker; where the
  markers land splits the text into each message's header, content and tail;
- the real render must equal that text with the contents put back (the template copies
  contents verbatim), and must start with the render of all but the last message (the
  prefix property the prefix cache relies on);
- a message's segment ends after its content plus the tail its role gets when it is the
  last message (read once per role, from the first message of that role), which is where
  the render of the list up to it ends.

A template that fails a check gets ``inference.prompt.local``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inference.prompt.types import ChatTokenizer, Message

_MARK = "\u2063CHATSITE-SEGMENT-"


@dataclass
class Layout:
    """The render of a conversation (no generation prompt) cut into its messages' segments."""

    text: str
    bounds: list[int]  # message i's segment is text[bounds[i]:bounds[i + 1]]
    # Message i's (header, tail) around its content within its segment, where known; None
    # where the template hides the content or it was not looked for (only stored answers need it).
    frames: list[tuple[str, str] | None]


def render(tokenizer: ChatTokenizer, messages: Sequence[Message]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=False)


def _marker(index: int) -> str:
    return f"{_MARK}{index}\u2063"


def marked_layout(
    tokenizer: ChatTokenizer, messages: Sequence[Message], text: str, before: str
) -> Layout | None:
    """Each message's segment in ``text``, the render of ``messages`` (``before``: the render
    of all but the last), or None where the checks in the module's docstring fail."""
    if not messages or any(_MARK in str(m["content"]) for m in messages):
        return None
    probe = [{"role": m["role"], "content": _marker(i)} for i, m in enumerate(messages)]
    glue = _glue(render(tokenizer, probe), len(messages))
    tails = _tails(tokenizer, probe) if glue is not None else None
    if glue is None or tails is None:
        return None
    contents = [str(m["content"]) for m in messages]
    if "".join(g + c for g, c in zip(glue, [*contents, ""], strict=True)) != text:
        return None
    bounds, frames, position = [0], [], 0
    for i, (message, content) in enumerate(zip(messages, contents, strict=True)):
        start = bounds[-1]
        position += len(glue[i])
        first, position = position, position + len(content)
        tail = tails[message["role"]]
        if not glue[i + 1].startswith(tail) or (i + 1 == len(messages) and glue[i + 1] != tail):
            return None
        frames.append((text[start:first], tail))
        bounds.append(position + len(tail))
    # The previous turn's prompt is where this one starts, and ends where its segments do.
    if len(before) != bounds[-2]:
        return None
    return Layout(text=text, bounds=bounds, frames=frames)


def _glue(marked: str, count: int) -> list[str] | None:
    """The text between the markers of ``marked``, in order, or None if one is missing,
    repeated or out of order."""
    if marked.count(_MARK) != count:
        return None
    glue, cursor = [], 0
    for i in range(count):
        at = marked.find(_marker(i), cursor)
        if at < 0:
            return None
        glue.append(marked[cursor:at])
        cursor = at + len(_marker(i))
    glue.append(marked[cursor:])
    return glue


def _tails(tokenizer: ChatTokenizer, probe: list[dict]) -> dict[str, str] | None:
    """For each role, what the template writes after a content of that role when it is
    the last message (read at the first message of the role); None if it hides one."""
    tails: dict[str, str] = {}
    for i, message in enumerate(probe):
        if message["role"] not in tails:
            parts = render(tokenizer, probe[: i + 1]).split(message["content"])
            if len(parts) != 2:
                return None
            tails[message["role"]] = parts[1]
    return tails
