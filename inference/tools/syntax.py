"""The pieces a tool-call format is written in, matched incrementally and in linear time.

A format describes its call head (``<tool_call>{"name": "f", "arguments": ``), what closes a
call and what joins calls as short sequences of ``Item``s: literals, optional literals,
whitespace, a name. ``Matcher`` matches such a sequence against text that arrives in pieces:
it keeps its place between pieces, so each character is looked at a bounded number of
times however the text is split, and it tells "not yet" (the text so far could still
match) from "no" (it cannot). ``JsonValueScanner`` finds where a JSON value ends, also
resumably. Runs of whitespace and string contents are skipped with single character-class
searches (linear, in C); no pattern that can backtrack is used, as backtracking over runs of
whitespace is what makes a regex-based parse quadratic.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum

_WS = " \t\r\n"
_NOT_WS = re.compile(r"[^ \t\r\n]")
_STRING_SPECIAL = re.compile(r'["\\]')  # what ends or escapes inside a JSON string
MAX_NAME_CHARS = 256  # a function name longer than this is not a call head


@dataclass(frozen=True)
class Lit:
    """Exact text; ``alts`` are accepted in its place (``"arguments"`` or ``"parameters"``)."""

    text: str
    alts: tuple[str, ...] = ()
    optional: bool = False
    peek: bool = False  # only looked at: the text stays for what comes next


@dataclass(frozen=True)
class Ws:
    """Optional whitespace."""


@dataclass(frozen=True)
class JsonName:
    """The function's name as a JSON string (``"get_weather"``)."""


@dataclass(frozen=True)
class BareName:
    """The function's name as bare text, ending before whitespace or one of ``stops``."""

    stops: tuple[str, ...] = ("<",)


Item = Lit | Ws | JsonName | BareName


class Match(Enum):
    DONE = "done"
    MORE = "more"  # the text so far could still match: wait for more
    FAIL = "fail"


class Matcher:
    """Matches ``items`` from the start of a growing buffer; ``feed(buf)`` takes the whole
    buffer each time (it only grows) and resumes where the last call stopped."""

    def __init__(self, items: tuple[Item, ...], start: int = 0) -> None:
        self.items = items
        self.step = 0  # the item being matched
        self.pos = start  # where it starts in the buffer
        self.name: str | None = None

    def shift(self, k: int) -> None:
        """The buffer lost its first ``k`` characters."""
        self.pos -= k

    def feed(self, buf: str, final: bool = False) -> Match:
        """DONE (``self.pos`` is the end of the match), MORE or FAIL. ``final``: no more
        text will come, so MORE becomes FAIL."""
        while self.step < len(self.items):
            item = self.items[self.step]
            if isinstance(item, Ws):
                found = _NOT_WS.search(buf, self.pos)
                self.pos = len(buf) if found is None else found.start()
                if self.pos == len(buf) and not final:
                    return Match.MORE  # whitespace may go on
                self.step += 1
                continue
            if isinstance(item, Lit):
                state = self._literal(item, buf, final)
            elif isinstance(item, JsonName):
                state = self._json_name(buf)
            else:
                state = self._bare_name(item, buf)
            if state is Match.MORE and final:
                state = Match.FAIL
            if state is not Match.DONE:
                return state
        return Match.DONE

    def _literal(self, item: Lit, buf: str, final: bool) -> Match:
        rest = buf[self.pos : self.pos + max(len(t) for t in (item.text, *item.alts))]
        for text in (item.text, *item.alts):
            if rest.startswith(text):
                self.pos += 0 if item.peek else len(text)
                self.step += 1
                return Match.DONE
        at_end = self.pos + len(rest) == len(buf) and not final
        if at_end and any(len(rest) < len(t) and t.startswith(rest) for t in (item.text, *item.alts)):
            return Match.MORE
        if item.optional:
            self.step += 1
            return Match.DONE
        return Match.FAIL

    def _json_name(self, buf: str) -> Match:
        if self.pos >= len(buf):
            return Match.MORE
        if buf[self.pos] != '"':
            return Match.FAIL
        i, escaped = self.pos + 1, False
        while i < len(buf) and i - self.pos <= MAX_NAME_CHARS:
            ch = buf[i]
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                try:
                    name = json.loads(buf[self.pos : i + 1])
                except ValueError:
                    return Match.FAIL
                if not name:
                    return Match.FAIL
                self.name, self.pos, self.step = name, i + 1, self.step + 1
                return Match.DONE
            i += 1
        return Match.MORE if i - self.pos <= MAX_NAME_CHARS else Match.FAIL

    def _bare_name(self, item: BareName, buf: str) -> Match:
        i = self.pos
        while i < len(buf) and i - self.pos <= MAX_NAME_CHARS:
            ch = buf[i]
            if ch in _WS or any(buf.startswith(s, i) for s in item.stops):
                if i == self.pos:
                    return Match.FAIL
                self.name, self.pos, self.step = buf[self.pos : i], i, self.step + 1
                return Match.DONE
            i += 1
        return Match.MORE if i - self.pos <= MAX_NAME_CHARS else Match.FAIL


class JsonValueScanner:
    """Finds the end of one JSON value (an object, an array or a string) in text that
    arrives in pieces; leading whitespace belongs to the value."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False

    def scan(self, text: str, start: int = 0) -> int | None:
        """The end of the value in ``text`` from ``start`` (what earlier calls did not see), or None."""
        i = start
        while i < len(text):
            if self.in_string and not self.escaped:
                found = _STRING_SPECIAL.search(text, i)  # jump over the string's plain characters
                if found is None:
                    return None
                i = found.start()
            elif not self.in_string:
                found = _NOT_WS.search(text, i)  # and over whitespace between tokens
                if found is None:
                    return None
                if self.started and self.depth == 0 and found.start() > i:
                    return i  # a bare scalar ends at whitespace
                i = found.start()
            ch = text[i]
            i += 1  # now past ch
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i
            elif ch == '"':
                self.in_string, self.started = True, True
            elif ch in "{[":
                self.depth, self.started = self.depth + 1, True
            elif ch in "}]":
                if self.depth == 0 and self.started:
                    return i - 1  # the end of a bare scalar
                self.depth -= 1
                if self.depth <= 0:
                    return i
            elif not self.started:
                self.started = True  # a bare scalar: ends at the next delimiter
            elif self.depth == 0 and ch in ",;<":
                return i - 1
        return None


class TriggerFinder:
    """The first trigger at or after a position of a buffer that only grows at its end (and is
    cut at its start, ``shift``): each trigger's next occurrence is remembered, and a search
    that found none resumes where it stopped, so every character is searched a bounded
    number of times however often it is asked."""

    def __init__(self, triggers: tuple[str, ...]) -> None:
        self.triggers = triggers
        self._found: dict[str, int] = {}  # trigger -> its next occurrence, once found
        self._searched: dict[str, int] = dict.fromkeys(triggers, 0)  # no occurrence starts before

    def first(self, buf: str, at: int) -> int:
        best = -1
        for trigger in self.triggers:
            found = self._found.get(trigger, -1)
            if found < at:
                start = max(at, self._searched[trigger])
                found = buf.find(trigger, start)
                if found < 0:
                    self._searched[trigger] = max(start, len(buf) - len(trigger) + 1)
                    self._found.pop(trigger, None)
                    continue
                self._found[trigger] = found
            if best < 0 or found < best:
                best = found
        return best

    def shift(self, k: int) -> None:
        self._found = {t: p - k for t, p in self._found.items()}
        self._searched = {t: max(0, p - k) for t, p in self._searched.items()}


def partial_suffix(text: str, triggers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper start of one of ``triggers``."""
    best = 0
    for trigger in triggers:
        for k in range(min(len(trigger) - 1, len(text)), best, -1):
            if text.endswith(trigger[:k]):
                best = k
                break
    return best
