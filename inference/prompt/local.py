"""Segments of a template that does not copy contents verbatim (trims them, escapes them,
writes them as JSON), still from a number of renders linear in the messages.

Message i's segment is read as the render of a short stand-in prefix plus message i, minus
the render of that stand-in prefix. The stand-in keeps what templates look at besides the
message itself: the first message (a system prompt, ``loop.first``), the message before
(role alternation) and the position's parity (``loop.index``); it is the first message,
then the real messages from an odd position up to i. The pieces must then add up to the
render of the whole conversation and end the render of all but its last message where
that render ends, or the conversation is rendered whole instead (``exact`` False).
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.prompt.layout import Layout, render
from inference.prompt.types import ChatTokenizer, Message

# Stands in for an answer's content to find where the template puts it.
_SENTINEL = "\u2063CHATSITE-CONTENT\u2063"


def stand_in(messages: Sequence[Message], i: int) -> list[Message]:
    """What stands before message ``i`` in its probe: at most three messages."""
    if i <= 2:
        return list(messages[:i])
    begin = i - 1 if (i - 1) % 2 else i - 2
    return [messages[0], *messages[begin:i]]


def local_layout(
    tokenizer: ChatTokenizer, messages: Sequence[Message], text: str, before: str
) -> Layout | None:
    """Each message's segment in ``text``, the render of ``messages`` (``before``: the render
    of all but the last), or None where the pieces do not add up to it."""
    try:
        return _local_layout(tokenizer, messages, text, before)
    except Exception:  # noqa: BLE001 - the template rejects a stand-in prefix
        return None  # (gpt-oss's: a tool result whose call the stand-in left out)


def _local_layout(
    tokenizer: ChatTokenizer, messages: Sequence[Message], text: str, before: str
) -> Layout | None:
    bounds, frames = [0], []
    for i, message in enumerate(messages):
        prefix = stand_in(messages, i)
        head = render(tokenizer, prefix)
        whole = render(tokenizer, [*prefix, message])
        if not whole.startswith(head):
            return None  # the template rewrites what came before
        segment = whole[len(head) :]
        if text[bounds[-1] : bounds[-1] + len(segment)] != segment:
            return None
        bounds.append(bounds[-1] + len(segment))
        stored = message.get("token_ids") is not None and message["role"] == "assistant"
        frames.append(_frame(tokenizer, prefix, head) if stored else None)
    if bounds[-1] != len(text) or len(before) != bounds[-2]:
        return None
    return Layout(text=text, bounds=bounds, frames=frames)


def _frame(tokenizer: ChatTokenizer, prefix: list[Message], head: str) -> tuple[str, str] | None:
    """The header and tail an answer after ``prefix`` gets around its content, or None if
    the template hides the content."""
    probe = render(tokenizer, [*prefix, {"role": "assistant", "content": _SENTINEL}])
    if not probe.startswith(head) or _SENTINEL not in probe:
        return None
    header, tail = probe[len(head) :].split(_SENTINEL, 1)
    return header, tail
