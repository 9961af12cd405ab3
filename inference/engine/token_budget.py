"""The seam of a token budget: what a caller hands the engine with a request (see
``inference.engine.token_gate`` for how the engine charges it)."""

from __future__ import annotations

from typing import Protocol

# A request's ``stop_reason`` when its budget stopped it (``finish_reason`` is "length").
QUOTA_STOP = "quota"


class TokenGate(Protocol):
    def charge(self, tokens: int) -> bool:
        """Count ``tokens`` more output tokens; False once the budget is spent. Called on the
        engine's thread: it must not raise, and should answer quickly."""
        ...
