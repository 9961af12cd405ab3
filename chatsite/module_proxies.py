"""Daphne's lookups in Twisted's HTTP module, without Twisted's deprecation proxy.

Twisted wraps ``twisted.web.http`` in a ``_ModuleProxy`` so that reading a deprecated name
from it warns; every attribute read through the proxy runs several Python calls (a few µs).
Daphne reads ``http.Request`` through it on every write of a response body, and a streamed
answer is hundreds of writes. Here Daphne's modules (and ours) hold the module itself. None
of them reads a deprecated name, so nothing is lost but the cost of each read.
"""

from __future__ import annotations

from types import ModuleType

from daphne import http_protocol, server

from chatsite import body_limit


def unwrapped(module: object) -> object:
    """The module a Twisted deprecation proxy wraps; anything else as it is (a Twisted
    without the proxy, or one that keeps the module elsewhere). ``type``, not ``isinstance``:
    the proxy forwards ``__class__`` to the module it wraps."""
    if type(module) is ModuleType:
        return module
    try:
        inner = object.__getattribute__(module, "_module")
    except AttributeError:
        return module
    return inner if isinstance(inner, ModuleType) else module


def install() -> None:
    for holder in (http_protocol, server, body_limit):
        holder.http = unwrapped(holder.http)
