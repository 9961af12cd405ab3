"""One sequence's grammar state: an xgrammar matcher, made once its grammar compiled."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)


class SequenceGrammar:
    """Follows its sequence token by token. The matcher is created on first use (the
    scheduler runs a request only once its grammar compiled); tokens accepted before
    that (``history``) are replayed into it. A grammar that failed to compile leaves
    ``failed`` set: the masking then allows only EOS, so the sequence ends at once."""

    def __init__(
        self, compiled: Future[Any], history: Iterable[int] = (), stop_token_ids: Iterable[int] = ()
    ) -> None:
        self.compiled = compiled
        self.stop_token_ids = tuple(stop_token_ids)  # what a failed grammar still allows
        self.matcher: Any = None
        self.keep: Any = None  # CompiledGrammar.keep, once the matcher exists
        self.failed = False
        self._history = list(history)

    @property
    def ready(self) -> bool:
        return self.compiled.done()

    def get_matcher(self) -> Any:
        """The xgrammar matcher (None if the grammar failed); its grammar must be compiled."""
        if self.matcher is None and not self.failed:
            import xgrammar as xgr

            try:
                compiled = self.compiled.result(timeout=0)
            except Exception as exc:  # noqa: BLE001 - a compile error ends the sequence, not the engine
                logger.warning("grammar failed to compile: %s", exc)
                self.failed = True
                return None
            self.keep = compiled.keep
            self.matcher = xgr.GrammarMatcher(compiled.grammar)
            for token in self._history:
                if not self.matcher.accept_token(token):
                    self.failed = True
                    return None
            self._history = []
        return self.matcher

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it."""
        matcher = self.get_matcher()
        if matcher is None:
            return False
        if matcher.is_terminated():
            return False
        return bool(matcher.accept_token(int(token)))

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (speculative decoding's rejects)."""
        if num_tokens <= 0:
            return
        matcher = self.get_matcher()
        if matcher is not None:
            matcher.rollback(num_tokens)

    def fork(self) -> SequenceGrammar:
        """An independent copy at the same point (n > 1 children, beams)."""
        child = SequenceGrammar(self.compiled, self._history, self.stop_token_ids)
        child.failed = self.failed
        if self.matcher is not None:
            child.matcher = self.matcher.fork()
            child.keep = self.keep
        return child

    @classmethod
    def replay(
        cls, compiled: Future[Any], output_token_ids: Iterable[int], stop_token_ids: Iterable[int] = ()
    ) -> SequenceGrammar:
        """A fresh state advanced over ``output_token_ids`` (a sequence whose state was lost)."""
        return cls(compiled, output_token_ids, stop_token_ids)

    def is_terminated(self) -> bool:
        matcher = self.get_matcher()
        return matcher is None or bool(matcher.is_terminated())
