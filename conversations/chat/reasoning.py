"""A streaming answer's reasoning (``<think>`` text of a reasoning model), kept apart
from its content: the fields it adds to websocket ``delta`` events and to the saved
message (the reasoning contract in docs/interfaces.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference import StreamDelta


@dataclass
class Reasoning:
    text: str = ""
    started: float | None = None  # monotonic time of the first reasoning text
    ended: float | None = None  # ... of the first answer text after it

    def add(self, delta: StreamDelta, now: float | None = None) -> dict[str, str]:
        """Take an engine delta's reasoning; returns the fields for its ``delta`` event
        (``{"reasoning": new text}``, or nothing when it has none)."""
        now = time.monotonic() if now is None else now
        new = getattr(delta, "reasoning", "") or ""
        if new:
            self.text += new
            if self.started is None:
                self.started = now
        if delta.text and self.started is not None and self.ended is None:
            self.ended = now
        return {"reasoning": new} if new else {}

    def seconds(self, now: float | None = None) -> float | None:
        """How long the model thought: first reasoning text to first answer text (or to
        ``now`` if the answer never came); None without reasoning."""
        if self.started is None:
            return None
        end = self.ended if self.ended is not None else (time.monotonic() if now is None else now)
        return round(end - self.started, 3)

    def message_fields(self, now: float | None = None) -> dict[str, object]:
        """The ``Message`` fields (also the keys of a message dict)."""
        return {"reasoning": self.text, "reasoning_seconds": self.seconds(now)}
