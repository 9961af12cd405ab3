"""Autobahn (Daphne's websocket protocol) formats the arguments of its debug log lines
before its logger drops them: a pretty-printed configuration for every connection, and
coloured names for every frame sent. In its websocket module those formatters become
lazy: they run when a debug line is written, and cost nothing otherwise."""

from __future__ import annotations

import pprint
from collections.abc import Callable
from typing import Any

LAZY_NAMES = ("pformat", "hltype", "hlval")


class Lazy:
    """``fn(*args)``, worked out when formatted into a log line."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __str__(self) -> str:
        return str(self.fn(*self.args))

    def __format__(self, spec: str) -> str:
        return format(self.fn(*self.args), spec)

    __repr__ = __str__


def _lazy(fn: Callable[..., Any]) -> Callable[..., Lazy]:
    def deferred(*args: Any) -> Lazy:
        return Lazy(fn, *args)

    deferred.lazy_of = fn  # type: ignore[attr-defined]
    return deferred


def install() -> None:
    from autobahn.websocket import protocol  # noqa: PLC0415 - only where Daphne serves

    for name in LAZY_NAMES:
        current = getattr(protocol, name)
        if not hasattr(current, "lazy_of"):
            setattr(protocol, name, _lazy(current))
    # The one use that is not a log argument: a string, as before.
    protocol.Timings.__str__ = lambda self: pprint.pformat(self._timings)
