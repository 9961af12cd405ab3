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

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from inference.prompt.types import ChatTokenizer, Message

_MARK = "\u2063CHATSITE-SEGMENT-"
# Role sequences whose probe is kept, per tokenizer (an API call's one or two messages, a
# chat's recent lengths); older ones are dropped first.
PROBES_KEPT = 512


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
    roles = tuple(str(m["role"]) for m in messages)
    probe, kept = _PROBES.get(tokenizer, roles)
    if probe is None:  # the template hides a content: never a marked layout
        return None
    layout = _checked_layout(messages, text, before, probe)
    if layout is None and kept:  # the template's output may have changed (a date it prints)
        probe = _PROBES.fresh(tokenizer, roles)
        layout = _checked_layout(messages, text, before, probe) if probe is not None else None
    return layout


@dataclass(frozen=True)
class _Probe:
    """The render of a role sequence with markers for contents: the text around each
    content (``glue``) and what each role ends with as the last message (``tails``). It
    depends on the roles alone, so one serves every conversation of that role sequence;
    each use still checks it against the real render."""

    glue: list[str]
    tails: dict[str, str]


_Kept = OrderedDict[tuple[str, ...], "_Probe | None"]  # role sequence -> its probe, oldest first


class _ProbeStore:
    """Probes per tokenizer and role sequence, most recently used kept; encodings run in
    several threads at once, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tokenizer: WeakKeyDictionary[ChatTokenizer, _Kept] = WeakKeyDictionary()

    def get(self, tokenizer: ChatTokenizer, roles: tuple[str, ...]) -> tuple[_Probe | None, bool]:
        """The probe, and whether it was kept from an earlier call (else made now)."""
        with self._lock:
            kept = self._by_tokenizer.get(tokenizer)
            if kept is not None and roles in kept:
                kept.move_to_end(roles)
                return kept[roles], True
        return self.fresh(tokenizer, roles), False

    def fresh(self, tokenizer: ChatTokenizer, roles: tuple[str, ...]) -> _Probe | None:
        probe = [{"role": role, "content": _marker(i)} for i, role in enumerate(roles)]
        try:
            glue = _glue(render(tokenizer, probe), len(roles))
            tails = _tails(tokenizer, probe) if glue is not None else None
        except Exception:  # noqa: BLE001 - the template rejects role and content alone
            glue = tails = None  # (gpt-oss's: a tool result without the call it answers)
        found = _Probe(glue, tails) if glue is not None and tails is not None else None
        with self._lock:
            kept = self._by_tokenizer.setdefault(tokenizer, OrderedDict())
            kept[roles] = found
            kept.move_to_end(roles)
            if len(kept) > PROBES_KEPT:
                kept.popitem(last=False)
        return found


_PROBES = _ProbeStore()


def _checked_layout(messages: Sequence[Message], text: str, before: str, probe: _Probe) -> Layout | None:
    glue, tails = probe.glue, probe.tails
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
