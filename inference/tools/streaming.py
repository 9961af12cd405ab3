"""Reads tool calls out of an answer while it streams, for OpenAI's incremental deltas.

``ToolCallParser(format).feed(text)`` returns events as text arrives: ``TextPiece`` (content
to show; text that may be the start of the format's trigger is held back), ``CallStart``
(a call's id and name, once its name is complete) and ``ArgumentsPiece`` (its arguments'
JSON text, piece by piece). ``finish()`` flushes what is held back at the end.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from inference.tools.calls import new_call_id

# A call's head after its trigger: the name, then the arguments' key.
_HEAD = re.compile(r'\s*\{?\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_MAX_HEAD_CHARS = 1024  # a trigger not followed by a call head within this is plain text


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPiece:
    index: int
    text: str


class ToolCallParser:
    def __init__(self, tool_format: Any) -> None:
        self.trigger: str = tool_format.trigger
        self.end_marker: str = tool_format.call_end.split()[-1]  # the last thing a call writes
        # Where the head's ``"name"`` is looked for: inside the trigger (Llama's ``{"name"``) or after it.
        at = self.trigger.find('"name"')
        self._head_start = at if at >= 0 else len(self.trigger)
        self.buf = ""
        self.mode = "text"  # text | head | args | tail
        self.num_calls = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> list[Any]:
        self.buf += text
        events: list[Any] = []
        while self._advance(events):
            pass
        return events

    def finish(self) -> list[Any]:
        """The end of the answer: held-back text (and an unfinished call head) is content."""
        events: list[Any] = []
        if self.mode in ("text", "head") and self.buf:
            self._text(events, self.buf)
        self.buf = ""
        return events

    # ---- states ----------------------------------------------------------------------
    def _advance(self, events: list[Any]) -> bool:
        """One state's work; True if it moved to another state with text left to read."""
        if self.mode == "text":
            at = self.buf.find(self.trigger)
            if at < 0:
                keep = _partial_suffix(self.buf, self.trigger)
                self._text(events, self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return False
            self._text(events, self.buf[:at])
            self.buf, self.mode = self.buf[at:], "head"
            return True
        if self.mode == "head":
            match = _HEAD.match(self.buf, self._head_start)
            if match is None:
                if len(self.buf) > _MAX_HEAD_CHARS:  # not a call after all
                    self._text(events, self.buf)
                    self.buf, self.mode = "", "text"
                return False
            name = json.loads(f'"{match.group(1)}"')
            events.append(CallStart(self.num_calls, new_call_id(), name))
            self.num_calls += 1
            self.buf, self.mode = self.buf[match.end() :], "args"
            self._depth, self._in_string, self._escaped = 0, False, False
            return True
        if self.mode == "args":
            end = self._scan_arguments()
            piece = self.buf[:end] if end is not None else self.buf
            if piece:
                events.append(ArgumentsPiece(self.num_calls - 1, piece))
            self.buf = self.buf[len(piece) :]
            if end is None:
                return False
            self.mode = "tail"
            return True
        at = self.buf.find(self.end_marker)  # tail: up to the end of the call
        if at < 0:
            return False
        self.buf, self.mode = self.buf[at + len(self.end_marker) :], "text"
        return True

    def _scan_arguments(self) -> int | None:
        """Where the arguments' JSON value ends in ``buf`` (None: not yet); the scan's
        state carries over between pieces."""
        for i, ch in enumerate(self.buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None

    def _text(self, events: list[Any], text: str) -> None:
        # Whitespace between calls is layout, not content.
        if text and not (self.num_calls and not text.strip()):
            events.append(TextPiece(text))


def _partial_suffix(text: str, trigger: str) -> int:
    """Length of the longest end of ``text`` that begins ``trigger``."""
    for k in range(min(len(trigger) - 1, len(text)), 0, -1):
        if text.endswith(trigger[:k]):
            return k
    return 0
