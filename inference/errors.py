"""Exceptions the engine raises to its callers (the web layer maps them to responses)."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture (or one of its features) has no implementation here."""

    def __init__(self, architecture: str, detail: str = "") -> None:
        self.architecture = architecture
        message = f"unsupported model architecture {architecture!r}"
        if detail:
            message += f": {detail}"
        super().__init__(message)


class PromptTooLongError(ValueError):
    """The prompt does not fit the model's context (``num_tokens`` > ``limit``)."""

    def __init__(self, num_tokens: int, limit: int) -> None:
        self.num_tokens = num_tokens
        self.limit = limit
        super().__init__(f"prompt has {num_tokens} tokens, more than the limit of {limit}")


class InvalidPromptError(ValueError):
    """A prompt token id outside the model's vocabulary (``0 <= id < vocab_size``): e.g.
    ids stored under another model. Refused at admission, so it fails its own request
    only, never the step that would have run it with every other request."""

    def __init__(self, token_id: int, position: int, vocab_size: int) -> None:
        self.token_id = token_id
        self.position = position
        self.vocab_size = vocab_size
        super().__init__(
            f"prompt token id {token_id} at position {position} is not in the model's vocabulary "
            f"(ids 0 to {vocab_size - 1})"
        )


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; the caller should retry later (HTTP 503)."""
