"""Daphne reads Twisted's HTTP module directly, not through Twisted's deprecation proxy,
and still serves through it (the live site's tests cover the serving)."""

from __future__ import annotations

import sys
from types import ModuleType

from daphne import http_protocol, server

from chatsite import body_limit, module_proxies


def test_daphne_holds_the_http_module_itself_after_install():
    assert type(sys.modules["twisted.web.http"]) is not ModuleType  # Twisted still wraps it
    module_proxies.install()
    for holder in (http_protocol, server, body_limit):
        assert type(holder.http) is ModuleType, holder.__name__  # the proxy passes isinstance
        assert holder.http.Request is sys.modules["twisted.web.http"].Request


def test_unwrapping_leaves_plain_modules_and_other_objects_alone():
    assert module_proxies.unwrapped(sys) is sys
    thing = object()
    assert module_proxies.unwrapped(thing) is thing
