"""gpt-oss's harmony answers split into reasoning and answer text.

A harmony answer is a run of messages, each ``<header><|message|><body>`` ended by
``<|end|>``, ``<|call|>`` or ``<|return|>``; a new one opens with ``<|start|>``. The
generation prompt ends with ``<|start|>assistant``, so the answer begins with a header such
as ``<|channel|>analysis``. By channel and recipient:

- ``analysis``: reasoning;
- a message to a function (``to=functions.NAME``, in the header before or after the
  channel): kept in the answer as ``<|channel|>commentary to=functions.NAME<|message|>``,
  its body and ``<|call|>``, for the harmony tool format (``inference.tools.harmony``);
- anything else (``final``, a ``commentary`` preamble to the user): answer text, plain.

Text that does not start like a header is answer text: a model that ignores the format
still answers. A marker split over several pieces is held back until it is decided; a header
the answer's end cuts (``max_tokens``) is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = (START, CHANNEL, MESSAGE, "<|constrain|>", *ENDS)
_HEADER_STARTS = (CHANNEL, START, "assistant", "to=", "<|constrain|>")
_MAX_HEADER_CHARS = 256


def _field(header: str, key: str) -> str:
    at = header.find(key)
    if at < 0:
        return ""
    rest = header[at + len(key) :]
    end = len(rest)
    for stop in (" ", "\n", "<|"):
        found = rest.find(stop)
        if 0 <= found < end:
            end = found
    return rest[:end]


@dataclass
class HarmonySplitter:
    reasoning: str = ""  # everything emitted so far, per side
    answer: str = ""
    _state: str = "header"  # header | body | between
    _buf: str = ""
    _route: str = "answer"  # where the current body goes: reasoning | answer | call
    _gap: bool = False  # the current answer message follows another one

    def push(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._step(reasoning, answer, final=False):
            pass
        return self._emit(reasoning, answer)

    def flush(self) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        while self._step(reasoning, answer, final=True):
            pass
        return self._emit(reasoning, answer)

    def _emit(self, reasoning: list[str], answer: list[str]) -> tuple[str, str]:
        r, a = "".join(reasoning), "".join(answer)
        self.reasoning += r
        self.answer += a
        return r, a

    def _step(self, reasoning: list[str], answer: list[str], final: bool) -> bool:
        buf = self._buf
        if self._state == "between":  # after a message: the next one's <|start|>, or plain text
            stripped = buf.lstrip()
            if stripped.startswith(START):
                self._buf, self._state = stripped[len(START) :], "header"
                return True
            if START.startswith(stripped) and not final:
                return False
            self._state, self._route = "body", "answer"
            return bool(buf)
        if self._state == "header":
            at = buf.find(MESSAGE)
            if at < 0:
                head = buf.lstrip()
                maybe = any(h.startswith(head) or head.startswith(h) for h in _HEADER_STARTS)
                if maybe and len(buf) <= _MAX_HEADER_CHARS:
                    if final:  # a header the answer's end cut: markup, not text
                        self._buf = ""
                    return False
                self._state, self._route = "body", "answer"  # not a header: plain answer text
                return bool(buf)
            header, self._buf = buf[:at], buf[at + len(MESSAGE) :]
            recipient = _field(header, "to=")
            if recipient.startswith("functions."):
                self._route = "call"
                answer.append(f"{CHANNEL}commentary to={recipient}{MESSAGE}")
            else:
                self._route = "reasoning" if _field(header, CHANNEL) == "analysis" else "answer"
            # Two answer messages (a preamble, then the final one) are two paragraphs.
            self._gap = self._route == "answer" and bool(self.answer or answer)
            self._state = "body"
            return True
        # body: up to the message's end, or a new message's start
        ends = [(buf.find(m), m) for m in (*ENDS, START)]
        found = [(at, m) for at, m in ends if at >= 0]
        if not found:
            keep = 0 if final else _partial_suffix(buf, MARKERS)
            self._out(reasoning, answer, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        at, marker = min(found)
        self._out(reasoning, answer, buf[:at])
        if self._route == "call" and marker == "<|call|>":
            answer.append(marker)
        if marker == START:
            self._buf, self._state = buf[at + len(START) :], "header"
        else:
            self._buf, self._state = buf[at + len(marker) :], "between"
        return True

    def _out(self, reasoning: list[str], answer: list[str], text: str) -> None:
        if not text:
            return
        if self._route == "reasoning":
            reasoning.append(text)
            return
        if self._gap:
            text, self._gap = "\n\n" + text, False
        answer.append(text)


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best
