"""Reasoning answers (DeepSeek-R1, Qwen3 and SmolLM3 style): ``<think>…</think>`` before the
answer. (gpt-oss's harmony channels are ``inference.sampling.harmony``'s.)

A chat template that marks reasoning (mentions the closing tag; R1's strips
everything before it from earlier assistant turns) makes the tokenizer report its
tags. For a request that asks for it, the engine splits each completion's text
stream into reasoning and answer with a ``ReasoningSplitter``:

- R1's generation prompt already opens ``<think>``: then the completion starts in
  reasoning. Otherwise it does only if its text starts with the opening tag.
- Everything up to the closing tag is reasoning, the rest is the answer; the tags
  and the whitespace around them are dropped.
- A tag may arrive split over several tokens, so text that could still become a tag
  (or trailing whitespace before a possible closing tag) is held back until it is
  decided; ``flush()`` releases it at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAG, CLOSE_TAG = "<think>", "</think>"


def template_reasoning_tags(chat_template: str | None) -> tuple[str, str] | None:
    """The (open, close) tags if the template marks reasoning, else None."""
    if template_reasoning_format(chat_template) == "think":
        return OPEN_TAG, CLOSE_TAG
    return None


def template_reasoning_format(chat_template: str | None) -> str | None:
    """How the template's model reasons, from the markers it writes: "harmony" (gpt-oss's
    analysis channel, ``inference.sampling.harmony``), "think" (``<think>…</think>``: R1,
    Qwen3, SmolLM3's think mode) or None."""
    if not isinstance(chat_template, str):
        return None
    if "<|channel|>" in chat_template and "analysis" in chat_template:
        return "harmony"
    if CLOSE_TAG in chat_template:
        return "think"
    return None


@dataclass
class ReasoningSplitter:
    tags: tuple[str, str] = (OPEN_TAG, CLOSE_TAG)
    in_reasoning: bool = False  # the prompt ended with the opening tag
    reasoning: str = ""  # everything emitted so far, per channel
    answer: str = ""
    _decided: bool = False  # past the point where an opening tag could still start
    _pending: str = ""  # held back: could still be (part of) a tag
    _answer_started: bool = False
    _reasoning_started: bool = False

    def __post_init__(self) -> None:
        self._decided = self.in_reasoning

    def push(self, text: str) -> tuple[str, str]:
        """Feed new completion text; returns the (reasoning, answer) text it releases."""
        self._pending += text
        reasoning, answer = [], []
        while self._pending:
            if not self._decided:
                stripped = self._pending.lstrip()
                open_tag = self.tags[0]
                if stripped.startswith(open_tag):
                    self._pending, self._decided, self.in_reasoning = stripped[len(open_tag) :], True, True
                    continue
                if open_tag.startswith(stripped):
                    break  # maybe the start of the opening tag: wait
                self._decided = True  # plain answer, no reasoning
                continue
            if not self.in_reasoning:
                answer.append(self._take_answer(self._pending))
                self._pending = ""
                break
            close_tag = self.tags[1]
            at = self._pending.find(close_tag)
            if at >= 0:
                reasoning.append(self._take_reasoning(self._pending[:at].rstrip()))
                self._pending, self.in_reasoning = self._pending[at + len(close_tag) :], False
                continue
            keep = _partial_suffix(self._pending, close_tag)
            body = self._pending[: len(self._pending) - keep]
            ready = body.rstrip()  # trailing whitespace waits: it is dropped before the tag
            reasoning.append(self._take_reasoning(ready))
            self._pending = self._pending[len(ready) :]
            break
        return "".join(reasoning), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """The end of the completion: release whatever was held back."""
        pending, self._pending = self._pending, ""
        if self.in_reasoning:
            return self._take_reasoning(pending.rstrip()), ""
        return "", self._take_answer(pending)

    def _take_reasoning(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip()
            self._reasoning_started = bool(text)
        self.reasoning += text
        return text

    def _take_answer(self, text: str) -> str:
        if not self._answer_started and self.reasoning:
            text = text.lstrip()  # the blank line R1 writes after </think>
        self._answer_started = self._answer_started or bool(text)
        self.answer += text
        return text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
