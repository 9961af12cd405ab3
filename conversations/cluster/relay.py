"""What a tab shows of an answer generated in another process, from the owner's pieces.

The owner relays an answer through the conversation's group as ``delta`` events (and, to
one tab that asked, a ``snapshot``): the new text at character ``offset`` of the whole
text, and the new reasoning (a reasoning model's thinking) at ``reasoning_offset`` of the
whole reasoning. A tab keeps how much of each it shows. A piece it has wholly seen is a
repeat and adds nothing; a piece that starts past what it shows is a gap, and the tab asks
the owner for a snapshot. A ``heartbeat`` carries both lengths so far (``length``,
``reasoning_length``): a tab that shows less has missed the last piece.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shown:
    """Characters of an answer's text and of its reasoning a tab shows."""

    text: int = 0
    reasoning: int = 0


def take(shown: Shown, event: dict) -> dict[str, str] | None:
    """The part of a relayed piece the tab has not shown, as a ``delta``'s fields
    (``text``, and ``reasoning`` when there is new thinking), advancing ``shown``; None
    for a gap (then nothing is taken: a snapshot brings both parts at once)."""
    offset, text = event.get("offset", 0), event.get("text", "")
    # A piece without reasoning (an owner that relays text only) leaves the reasoning as is.
    reasoning_offset, reasoning = event.get("reasoning_offset", shown.reasoning), event.get("reasoning", "")
    if offset > shown.text or reasoning_offset > shown.reasoning:
        return None
    fresh_text = text[shown.text - offset :]
    fresh_reasoning = reasoning[shown.reasoning - reasoning_offset :]
    shown.text += len(fresh_text)
    shown.reasoning += len(fresh_reasoning)
    fresh = {"text": fresh_text}
    if fresh_reasoning:
        fresh["reasoning"] = fresh_reasoning
    return fresh


def behind(shown: Shown, heartbeat: dict) -> bool:
    """Whether the owner has sent more than the tab shows (it missed the last piece)."""
    return heartbeat.get("length", 0) > shown.text or heartbeat.get("reasoning_length", 0) > shown.reasoning
