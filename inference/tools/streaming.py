"""Reads tool calls out of an answer as it arrives: the one parser of every format.

``ToolCallParser(format).feed(text)`` returns events as text arrives: ``TextPiece`` (content
to show), ``CallStart`` (a call's id and name, once its head is complete) and
``ArgumentsPiece`` (its arguments' JSON text, piece by piece). ``finish(cut)`` ends the
answer. A finished answer is parsed by feeding it whole (``parse_answer``), so a streamed
answer and the same answer parsed at its end always agree.

The format's ``CallSyntax`` says what opens a call (its triggers), the call's head up to its
arguments, what closes it, and for formats that write a list of calls (``[TOOL_CALLS][...]``)
what joins two calls and what closes the list. The rules:

- Text that may be the start of a trigger, or a trigger whose head is not complete yet, is
  held back. If the head turns out not to be one, it is content after all.
- Whitespace just before a call and between calls is layout, not content.
- ``finish(cut=True)`` (the answer hit its token limit): held-back markup, a trigger or an
  unfinished head, is dropped rather than shown; a call cut in its arguments stays a call,
  with the arguments it got (``incomplete``), as OpenAI returns such a call.
- A call identical (name and arguments) to an earlier one ends the list: it and anything
  after it are dropped. Such a call is held back while it is still a copy of an earlier
  one, so a streamed answer never sends what its end would take back.

Every step resumes where the last one stopped (``inference.tools.syntax``): the parse is
linear in the answer's length however it is split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.tools.calls import ToolCall, new_call_id
from inference.tools.syntax import Item, JsonValueScanner, Match, Matcher, TriggerFinder, partial_suffix

_WS = " \t\r\n"


@dataclass(frozen=True)
class CallSyntax:
    triggers: tuple[str, ...]  # text that opens a call (or a list of calls)
    head: tuple[Item, ...]  # from a trigger's start to where the arguments begin
    tail: tuple[Item, ...] = ()  # after the arguments: the rest of the call
    next_head: tuple[Item, ...] | None = None  # list formats: a further call of the list
    list_end: tuple[Item, ...] = ()  # list formats: what closes the list


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


@dataclass
class _Call:
    name: str
    arguments: str = ""
    events: list[Any] = field(default_factory=list)  # held back while it copies an earlier call
    held: bool = False


class ToolCallParser:
    def __init__(self, tool_format: Any) -> None:
        self.syntax: CallSyntax = tool_format.syntax
        self.buf = ""
        self.at = 0  # buf[at:] is not read yet
        self.mode = "text"  # text | head | args | tail | between | done
        self.calls: list[_Call] = []
        self.incomplete = False  # the last call was cut in its arguments
        self.repeated = False  # a repeated call ended the list
        self._ws = ""  # whitespace at the end of the text so far, held back
        self._after_call = False  # no text since the last call: its leading whitespace is layout
        self._matcher: Matcher | None = None
        self._list_end: Matcher | None = None
        self._scanner = JsonValueScanner()
        self._finder = TriggerFinder(self.syntax.triggers)

    @property
    def num_calls(self) -> int:
        return sum(1 for c in self.calls if not c.held)

    def feed(self, text: str) -> list[Any]:
        events: list[Any] = []
        if self.mode == "done":
            return events
        self.buf += text
        while self._advance(events, final=False):
            pass
        self._compact()
        return events

    def finish(self, cut: bool = False) -> list[Any]:
        """The end of the answer; ``cut``: it ended at its token limit."""
        events: list[Any] = []
        if self.mode == "done":
            return events
        while self._advance(events, final=True, cut=cut):
            pass
        rest = self.buf[self.at :]
        if self.mode == "args":
            self.incomplete = True
            if self.calls and self.calls[-1].held:  # a cut copy of an earlier call: not a new one
                self.calls.pop()
                self.repeated = True
        elif self.mode == "text" and rest and not cut:
            self._text(events, rest)
        dropped = cut and (rest or self.mode in ("head", "between", "tail"))
        if self._ws and not self.calls and not dropped:  # whitespace before cut markup is layout
            events.append(TextPiece(self._ws))
        self.buf, self.at, self._ws, self.mode = "", 0, "", "done"
        return events

    # ---- states ----------------------------------------------------------------------
    # ``buf[at:]`` is what is not read yet; positions are kept rather than the buffer cut at
    # each step (a cut copies the rest: quadratic over many short steps). ``_compact`` drops
    # the read part once per ``feed``.
    def _compact(self) -> None:
        if self.at:
            k, self.at = self.at, 0
            self.buf = self.buf[k:]
            self._finder.shift(k)
            for matcher in (self._matcher, self._list_end):
                if matcher is not None:
                    matcher.shift(k)

    def _advance(self, events: list[Any], final: bool, cut: bool = False) -> bool:
        """One state's work; True if it moved on with text left to read."""
        syntax, buf = self.syntax, self.buf
        if self.mode == "text":
            at = self._finder.first(buf, self.at)
            if at < 0:
                held = not final or cut  # at a cut, a trigger's start is markup: dropped in finish
                keep = partial_suffix(buf[max(self.at, len(buf) - 64) :], syntax.triggers) if held else 0
                self._text(events, buf[self.at : len(buf) - keep])
                self.at = len(buf) - keep
                return False
            self._text(events, buf[self.at : at])
            self.at, self.mode, self._matcher = at, "head", Matcher(syntax.head, at)
            return True
        if self.mode in ("head", "between"):
            return self._head(events, final, cut)
        if self.mode == "args":
            end = self._scanner.scan(buf, self.at)
            stop = len(buf) if end is None else end
            if stop > self.at:
                self._arguments(events, buf[self.at : stop])
            self.at = stop
            if end is None:
                return False
            self.mode, self._matcher = "tail", Matcher(syntax.tail, self.at)
            return self._call_done(events)
        assert self._matcher is not None  # tail
        if final and cut:  # a call's closing markup, cut by the limit
            self.at, self.mode = len(buf), "text"
            return False
        state = self._matcher.feed(buf, final)
        if state is Match.MORE:
            return False
        self.at = self._matcher.pos  # on a failure, what matched is dropped too
        if state is Match.DONE and syntax.next_head is not None:
            self.mode = "between"
            self._matcher = Matcher(syntax.next_head, self.at)
            self._list_end = Matcher(syntax.list_end, self.at)
        else:
            self.mode = "text"
        return self.at < len(buf) or self.mode == "between"

    def _head(self, events: list[Any], final: bool, cut: bool) -> bool:
        assert self._matcher is not None
        buf = self.buf
        if final and cut:
            # The last feed left this undecided: everything held could still be a call's
            # head (or the list's next call), so it is markup the limit cut.
            self.at = len(buf)
            return False
        state = self._matcher.feed(buf, final)
        if self.mode == "between":
            assert self._list_end is not None
            closed = self._list_end.feed(buf, final)
            if closed is Match.DONE:
                self.at, self.mode = self._list_end.pos, "text"
                return self.at < len(buf)
            if state is Match.FAIL and closed is Match.FAIL:  # the list just stops
                self.mode = "text"
                return self.at < len(buf)
            if state is Match.FAIL:
                return False  # the close may still come
        if state is Match.MORE:
            return False
        if state is Match.FAIL:
            self._text(events, buf[self.at])  # not a call after all: its first character is text
            self.at, self.mode = self.at + 1, "text"
            return self.at < len(buf)
        name = self._matcher.name or ""
        self.at = self._matcher.pos
        self._ws, self._after_call = "", True  # whitespace before a call is layout
        held = any(c.name == name for c in self.calls)
        call = _Call(name, held=held)
        start = CallStart(len(self.calls), new_call_id(), name)
        self.calls.append(call)
        if held:
            call.events.append(start)
        else:
            events.append(start)
        self.mode, self._scanner = "args", JsonValueScanner()
        return True

    def _arguments(self, events: list[Any], piece: str) -> None:
        call = self.calls[-1]
        index = len(self.calls) - 1
        if not call.arguments:
            piece = piece.lstrip(_WS)
            if not piece:
                return
        call.arguments += piece
        event = ArgumentsPiece(index, piece)
        if not call.held:
            events.append(event)
            return
        call.events.append(event)
        if not any(c.name == call.name and c.arguments.startswith(call.arguments) for c in self.calls[:-1]):
            call.held = False  # no longer a copy: it is a call of its own
            events.extend(call.events)
            call.events = []

    def _call_done(self, events: list[Any]) -> bool:
        call = self.calls[-1]
        if call.held:  # the arguments are complete and copy an earlier call's: the list ends
            self.calls.pop()
            self.repeated, self.mode, self.at = True, "done", len(self.buf)
            return False
        return True

    def _text(self, events: list[Any], text: str) -> None:
        if not text:
            return
        text = self._ws + text
        if self._after_call:
            text = text.lstrip(_WS)
        body = text.rstrip(_WS)
        self._ws = text[len(body) :]
        if body:
            self._after_call = False
            events.append(TextPiece(body))


@dataclass
class ParsedAnswer:
    content: str
    calls: list[ToolCall]
    incomplete: bool = False  # the last call was cut in its arguments
    repeated: bool = False  # a repeated call ended the list


def parse_answer(tool_format: Any, text: str, cut: bool = False) -> ParsedAnswer:
    """A finished answer's content and calls, as streaming it would give them."""
    parser = ToolCallParser(tool_format)
    events = parser.feed(text) + parser.finish(cut)
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, CallStart):
            names[event.index] = (event.id, event.name)
            arguments[event.index] = []
        elif isinstance(event, ArgumentsPiece):
            arguments[event.index].append(event.text)
    calls = [ToolCall(names[i][0], names[i][1], "".join(arguments[i])) for i in sorted(names)]
    return ParsedAnswer(content, calls, parser.incomplete, parser.repeated)
